"""graddoctor: a doctor for PyTorch training loops.

Runs a training script for a few optimizer steps under instrumentation and reports the
gradient bugs that never crash: missing or misplaced zero_grad, stale gradients, clipping
before unscale, BatchNorm drifting in train mode, and their relatives.
"""

__version__ = "0.1.0"
