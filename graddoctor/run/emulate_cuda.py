"""``--emulate-cuda``: the script takes its GPU path while every tensor lives on the CPU.

Three parts, all installed through one ``Patcher`` and removed on exit (docs/emulate-cuda.md):

* ``torch.cuda``'s (and ``torch.accelerator``'s) queries answer as a machine with one GPU per
  local rank: ``is_available()`` is True, ``device_count()`` the launcher's local world size (1
  without a launcher), ``set_device``/``current_device`` keep an index, the memory statistics
  are 0, ``synchronize``/``empty_cache`` do nothing, streams and events are stand-ins whose
  ``elapsed_time`` measures the host's clock. What each query answered is kept for the report.
* A ``TorchFunctionMode`` (``DeviceMode``, built by ``_mode_class``) turns a CUDA device
  given to a torch function (a factory's ``device=``, ``Tensor.to``, ``Tensor.cuda``,
  ``pin_memory``) into the CPU. A move
  "to the GPU" of a tensor that is not on the emulated GPU yet makes a copy, as on a real GPU
  (a leaf moved with ``.cuda()`` is no leaf any more); a tensor whose storage was made for the
  emulated GPU is moved to it as itself. The storages are known by a weak set.
* AMP and distribution: ``autocast("cuda", dtype)`` runs as CPU autocast in that dtype (bf16
  where CPU autocast lacks it, said in a note); ``GradScaler("cuda")`` is an enabled scaler
  because CUDA "is available" (its real initial scale, 65536); ``init_process_group("nccl")``
  uses gloo; DDP's ``device_ids``/``output_device`` are dropped for a module on the CPU;
  ``torch.load`` maps CUDA storages to the CPU.

What cannot run on a CPU (custom CUDA kernels, Triton, flash-attention, apex, NCCL-only
collectives) still fails; ``explain_failure`` then names the call and the script's line.
Torch function modes are per thread: a thread the script starts does not see the device
rewrite (the DataLoader's pin-memory thread needs none: pinning is the identity here).
"""

from __future__ import annotations

import contextlib
import linecache
import os
import threading
import time
import traceback
import types
import weakref
from typing import Any

from ..instrument.patcher import Originals, Patcher

DEVICE_NAME = "Emulated CUDA GPU (graddoctor --emulate-cuda, tensors on the CPU)"
CAPABILITY = (8, 0)  # an A100's: bf16 and TF32 supported, as most training scripts expect
TOTAL_MEMORY = 80 * 2 ** 30

# libraries whose kernels need a real GPU: importing or calling them cannot be emulated
GPU_ONLY_LIBRARIES = {
    "triton": "Triton kernels", "flash_attn": "flash-attention's CUDA kernels",
    "apex": "apex's fused CUDA ops", "xformers": "xformers' CUDA kernels",
    "bitsandbytes": "bitsandbytes' CUDA kernels", "transformer_engine": "Transformer Engine",
    "cupy": "CuPy", "pynvml": "NVML (the GPU driver's library)", "nvidia": "NVIDIA's libraries",
    "deepspeed": "DeepSpeed's CUDA ops", "mamba_ssm": "mamba's CUDA kernels",
    "causal_conv1d": "causal-conv1d's CUDA kernels", "liger_kernel": "Liger's Triton kernels",
}
_GPU_ONLY_MESSAGES = (
    "Torch not compiled with CUDA enabled", "Found no NVIDIA driver", "no CUDA GPUs",
    "0 active drivers", "CUDA driver", "without ATen_cuda library", "NCCL", "nccl",
    "not supported by gloo", "does not support", "CUDA error", "cudaGetDevice",
    "dummy base class", "CUDA", "cuda",
)


def local_ranks(environ=None) -> int:
    """The emulated GPUs: one per local rank of the launcher, 1 without one."""
    env = os.environ if environ is None else environ
    for key in ("LOCAL_WORLD_SIZE", "LOCAL_SIZE"):
        try:
            value = int(env.get(key) or 0)
        except ValueError:
            value = 0
        if value >= 1:
            return value
    return 1


def _is_cuda(device: Any) -> bool:
    """Whether a device argument names a CUDA device ("cuda", "cuda:1", torch.device, an index)."""
    if device is None or isinstance(device, bool):
        return False
    if isinstance(device, str):
        return device == "cuda" or device.startswith("cuda:")
    if isinstance(device, int):
        return True  # an index means a CUDA device (torch's convention)
    return getattr(device, "type", None) == "cuda"


def _is_index(device: Any) -> bool:
    return isinstance(device, int) and not isinstance(device, bool)


def _is_cpu(device: Any) -> bool:
    if isinstance(device, str):
        return device == "cpu" or device.startswith("cpu:")
    return getattr(device, "type", None) == "cpu"


class _Storages:
    """The storages made for the emulated GPU (weakly held): a move of a tensor on them to
    the GPU is no copy, as on a real GPU."""

    def __init__(self) -> None:
        self._ids: dict[int, weakref.ref] = {}

    def add(self, tensor) -> None:
        try:
            storage = tensor.untyped_storage()
            key = id(storage)
            ids = self._ids

            def forget(ref, key=key):
                if ids.get(key) is ref:
                    del ids[key]

            ids[key] = weakref.ref(storage, forget)
        except Exception:
            pass  # a tensor without storage (meta, a wrapper subclass): counted as moved each time

    def __contains__(self, tensor) -> bool:
        try:
            storage = tensor.untyped_storage()
        except Exception:
            return False
        ref = self._ids.get(id(storage))
        return ref is not None and ref() is storage


class FakeStream:
    """``torch.cuda.Stream`` / ``current_stream()``: work is done when it is queued."""

    def __init__(self, device=None, priority: int = 0, **_kwargs) -> None:
        self.device = device
        self.priority = priority
        self.cuda_stream = 0

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None):
        event = event if event is not None else FakeEvent()
        event.record(self)
        return event

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def is_capturing(self) -> bool:
        return False

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def __repr__(self) -> str:
        return "<emulated torch.cuda.Stream>"


class FakeEvent:
    """``torch.cuda.Event``: ``elapsed_time`` is the host's clock between two records (ms)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False, **_kwargs) -> None:
        self.enable_timing = enable_timing
        self.at: float | None = None

    def record(self, stream=None) -> None:
        self.at = time.perf_counter()

    def wait(self, stream=None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: "FakeEvent") -> float:
        if self.at is None or getattr(end, "at", None) is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end.at - self.at) * 1000.0


_DEFAULT_STREAM = FakeStream()


class CudaEmulation:
    """The context that emulates CUDA for one run (module docstring). ``answers`` holds what
    the fake told the script, in the order it was first asked; ``notes()`` says it."""

    def __init__(self, gpus: int | None = None) -> None:
        self.gpus = gpus or local_ranks()
        self.current = 0
        self.answers: dict[str, str] = {}
        self.changes: dict[str, str] = {}  # what was run otherwise than asked (nccl -> gloo, ...)
        self.storages = _Storages()
        self.patcher = Patcher()
        self.mode = None
        # graddoctor's own wrappers -> the functions they replaced (``watch_originals``)
        self.originals = Originals()
        self._lock = threading.Lock()
        self.autocast_fallback: str | None = None

    # -- bookkeeping ------------------------------------------------------------------------
    def answer(self, question: str, answer: Any) -> Any:
        """Keep what the script was answered (torch's own questions are not the script's)."""
        if question not in self.answers and not _caller_module().startswith(("torch.", "torch")):
            with self._lock:
                self.answers.setdefault(question, repr(answer) if not isinstance(answer, str)
                                        else answer)
        return answer

    def note_change(self, what: str, how: str) -> None:
        if what not in self.changes:
            with self._lock:
                self.changes.setdefault(what, how)

    def index_of(self, device=None) -> int:
        if device is None:
            return self.current
        if isinstance(device, int) and not isinstance(device, bool):
            return device
        if isinstance(device, str):
            device = device.split(":", 1)
            return int(device[1]) if len(device) > 1 and device[1] else self.current
        index = getattr(device, "index", None)
        return self.current if index is None else index

    def watch_originals(self, originals: Originals) -> None:
        """Hand the device mode the functions graddoctor's instrumentation patched over (built
        after this context is entered). Torch looks a Tensor method's public name up again when
        it dispatches to a mode, so graddoctor's own call of a saved original (a watcher's
        ``register_hook`` on an output) would reach the mode as the installed wrapper and run it:
        the script would seem to have registered a hook (which turns the dependency probes off),
        and the script's own calls would pass through the wrappers twice. The mode calls the
        original instead, as drawtwin's and repeatedterm's modes do."""
        self.originals = originals

    # -- torch.cuda -------------------------------------------------------------------------
    def _cuda_functions(self) -> dict[str, Any]:
        """What each patched ``torch.cuda`` name answers: devices, memory, RNG, streams."""
        return {**self._device_functions(), **self._memory_functions(),
                **self._rng_and_stream_functions()}

    def _device_functions(self) -> dict[str, Any]:
        emu = self

        real_available = torch_cuda_is_available()

        def is_available() -> bool:
            if _asked_by_compiler():
                return real_available  # torch.compile builds for the devices the tensors are on
            return emu.answer("is_available()", True)

        def device_count() -> int:
            return emu.answer("device_count()", emu.gpus)

        def current_device() -> int:
            return emu.answer("current_device()", emu.current)

        def set_device(device) -> None:
            index = emu.index_of(device)
            if index >= 0:
                emu.current = index
            emu.answer(f"set_device({index})", "kept (tensors stay on the CPU)")

        def get_device_name(device=None) -> str:
            return emu.answer("get_device_name()", DEVICE_NAME)

        def get_device_capability(device=None) -> tuple[int, int]:
            return emu.answer("get_device_capability()", CAPABILITY)

        def get_device_properties(device=None):
            emu.answer("get_device_properties()", f"{DEVICE_NAME}, capability "
                      f"{CAPABILITY[0]}.{CAPABILITY[1]}, {TOTAL_MEMORY >> 30} GiB")
            return types.SimpleNamespace(
                name=DEVICE_NAME, major=CAPABILITY[0], minor=CAPABILITY[1],
                total_memory=TOTAL_MEMORY, multi_processor_count=108, is_integrated=False,
                is_multi_gpu_board=False, uuid="emulated", L2_cache_size=40 * 2 ** 20,
                warp_size=32, gcnArchName="")

        def is_bf16_supported(including_emulation: bool = True) -> bool:
            return emu.answer("is_bf16_supported()", True)

        @contextlib.contextmanager
        def device(index):
            saved = emu.current
            if index is not None:
                i = emu.index_of(index)
                if i >= 0:
                    emu.current = i
            try:
                yield
            finally:
                emu.current = saved

        def device_of(obj):
            return contextlib.nullcontext()

        return {
            "is_available": is_available, "device_count": device_count,
            "current_device": current_device, "set_device": set_device,
            "get_device_name": get_device_name, "get_device_capability": get_device_capability,
            "get_device_properties": get_device_properties, "is_bf16_supported": is_bf16_supported,
            "is_tf32_supported": lambda: True, "is_initialized": lambda: True,
            "is_current_stream_capturing": lambda: False,
            "init": self._quiet("init"), "get_arch_list": lambda: ["sm_80"],
            "device": device, "device_of": device_of,
            "utilization": lambda device=None: 0,
        }

    def _quiet(self, name, answer=None):
        """A torch.cuda call that has nothing to do on the CPU; its answer noted once."""
        emu = self

        def call(*args, **kwargs):
            emu.answer(f"{name}()", "nothing to do" if answer is None else answer)
            return None
        call.__name__ = name
        return call

    def _memory_functions(self) -> dict[str, Any]:
        emu = self
        quiet = self._quiet

        def zero_bytes(name):
            def stat(device=None) -> int:
                return emu.answer(f"{name}()", 0)
            stat.__name__ = name
            return stat

        def memory_stats(device=None) -> dict:
            return emu.answer("memory_stats()", {})

        def mem_get_info(device=None) -> tuple[int, int]:
            return emu.answer("mem_get_info()", (TOTAL_MEMORY, TOTAL_MEMORY))

        functions = {
            "memory_stats": memory_stats, "mem_get_info": mem_get_info,
            "synchronize": quiet("synchronize"), "empty_cache": quiet("empty_cache"),
            "ipc_collect": quiet("ipc_collect"),
            "reset_peak_memory_stats": quiet("reset_peak_memory_stats"),
            "reset_max_memory_allocated": quiet("reset_max_memory_allocated"),
            "reset_max_memory_cached": quiet("reset_max_memory_cached"),
            "reset_accumulated_memory_stats": quiet("reset_accumulated_memory_stats"),
            "set_per_process_memory_fraction": quiet("set_per_process_memory_fraction"),
        }
        for name in ("memory_allocated", "max_memory_allocated", "memory_reserved",
                     "max_memory_reserved", "memory_cached", "max_memory_cached"):
            functions[name] = zero_bytes(name)
        return functions

    def _rng_and_stream_functions(self) -> dict[str, Any]:
        emu = self
        quiet = self._quiet

        def get_rng_state(device="cuda"):
            import torch

            emu.answer("get_rng_state()", "the CPU generator's state")
            return torch.get_rng_state()

        def get_rng_state_all():
            return [get_rng_state() for _ in range(emu.gpus)]

        def initial_seed() -> int:
            import torch

            return torch.initial_seed()

        def current_stream(device=None):
            emu.answer("streams", "stand-ins (work is done when queued)")
            return _DEFAULT_STREAM

        def default_stream(device=None):
            emu.answer("streams", "stand-ins (work is done when queued)")
            return _DEFAULT_STREAM

        def stream(s=None):
            emu.answer("streams", "stand-ins (work is done when queued)")
            return contextlib.nullcontext(s)

        class Stream(FakeStream):
            def __new__(cls, *args, **kwargs):
                emu.answer("streams", "stand-ins (work is done when queued)")
                return super().__new__(cls)

        class Event(FakeEvent):
            def __new__(cls, *args, **kwargs):
                emu.answer("events", "record the host's clock; elapsed_time in ms between records")
                return super().__new__(cls)

        return {
            "manual_seed": quiet("manual_seed", "accepted (the CPU generator is left alone)"),
            "manual_seed_all": quiet("manual_seed_all",
                                     "accepted (the CPU generator is left alone)"),
            "seed": quiet("seed", "accepted (the CPU generator is left alone)"),
            "seed_all": quiet("seed_all", "accepted (the CPU generator is left alone)"),
            "set_rng_state": quiet("set_rng_state", "accepted (the CPU generator is left alone)"),
            "set_rng_state_all": quiet("set_rng_state_all",
                                       "accepted (the CPU generator is left alone)"),
            "get_rng_state": get_rng_state, "get_rng_state_all": get_rng_state_all,
            "initial_seed": initial_seed,
            "current_stream": current_stream, "default_stream": default_stream,
            "set_stream": quiet("set_stream"), "stream": stream, "Stream": Stream,
            "Event": Event,
        }

    def _accelerator_functions(self) -> dict[str, Any]:
        import torch

        emu = self
        cuda = self._cuda_fakes

        def current_accelerator(check_available: bool = False):
            return emu.answer("torch.accelerator.current_accelerator()", torch.device("cuda"))

        def set_device_index(device) -> None:
            cuda["set_device"](device)

        real_available = accelerator_is_available()

        def is_available() -> bool:
            if _asked_by_compiler():
                return real_available
            return emu.answer("is_available()", True)

        def fresh(name):  # a function of its own (torch.compile keys its handlers by function)
            fake = cuda[name]

            def call(*args, **kwargs):
                return fake(*args, **kwargs)

            call.__name__ = name
            return call

        functions = {name: fresh(of) for name, of in (
            ("device_count", "device_count"), ("current_device_index", "current_device"),
            ("current_device_idx", "current_device"), ("synchronize", "synchronize"),
            ("empty_cache", "empty_cache"), ("set_stream", "set_stream"),
            ("current_stream", "current_stream"),
            ("memory_allocated", "memory_allocated"),
            ("max_memory_allocated", "max_memory_allocated"),
            ("memory_reserved", "memory_reserved"), ("max_memory_reserved", "max_memory_reserved"),
            ("memory_stats", "memory_stats"),
            ("reset_peak_memory_stats", "reset_peak_memory_stats"))}
        set_device_idx = fresh("set_device")
        return {**functions, "is_available": is_available,
                "current_accelerator": current_accelerator,
                "set_device_index": set_device_index, "set_device_idx": set_device_idx}

    # -- autocast, distribution, loading -----------------------------------------------------
    def _autocast_init(self, original):
        import torch

        emu = self
        supported = _cpu_autocast_dtypes()

        def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
            if device_type == "cuda":
                asked = dtype if dtype is not None else torch.float16  # CUDA's default
                dtype = asked
                if asked not in supported:
                    dtype = torch.bfloat16
                    emu.autocast_fallback = (
                        f"autocast('cuda', {_dtype_name(asked)}) ran as CPU autocast in bfloat16:"
                        f" CPU autocast in this torch does not support {_dtype_name(asked)}")
                emu.note_change(f"autocast('cuda', {_dtype_name(asked)})",
                             f"CPU autocast in {_dtype_name(dtype)}")
                device_type = "cpu"
            # no warnings.catch_warnings() here: its filter reset clears every module's
            # once-per-location registry, and a deprecation warning would show at every step
            return original(self, device_type, dtype, enabled, cache_enabled)

        __init__.__wrapped__ = original
        return __init__

    def _autocast_state(self, is_enabled, get_dtype):
        """The autocast state asked of "cuda" is the CPU autocast's that stands in for it:
        custom_fwd(device_type="cuda") records it in the forward, and custom_bwd re-enters that
        autocast for the backward, which a GPU runs in the forward's dtype (answered False, a
        Function's backward got fp16 gradients against fp32 saved tensors and stopped)."""

        def asks_cuda(args, kwargs) -> bool:
            device_type = args[0] if args else kwargs.get("device_type")
            return device_type is None or _is_cuda(device_type)  # no argument: CUDA's, as in torch

        def is_autocast_enabled(*args, **kwargs):
            if asks_cuda(args, kwargs):
                return is_enabled("cpu")
            return is_enabled(*args, **kwargs)

        def get_autocast_dtype(*args, **kwargs):
            if asks_cuda(args, kwargs) and is_enabled("cpu"):
                return get_dtype("cpu")
            return get_dtype(*args, **kwargs)

        return is_autocast_enabled, get_autocast_dtype

    def _init_process_group(self, original):
        emu = self

        def init_process_group(backend=None, *args, **kwargs):
            backend = emu.backend_for(backend, "init_process_group")
            if _is_cuda(kwargs.get("device_id")):
                kwargs["device_id"] = None
                emu.note_change("init_process_group(device_id=cuda)", "no device bound")
            return original(backend, *args, **kwargs)

        init_process_group.__wrapped__ = original
        return init_process_group

    def _new_group(self, original):
        emu = self

        def new_group(ranks=None, timeout=None, backend=None, *args, **kwargs):
            return original(ranks, timeout, emu.backend_for(backend, "new_group"), *args, **kwargs)

        new_group.__wrapped__ = original
        return new_group

    def backend_for(self, backend, call: str):
        asked = getattr(backend, "value", backend)
        if backend is None or (isinstance(asked, str) and "nccl" in asked.lower()):
            self.note_change(f"{call}({asked!r})" if backend is not None else f"{call}()",
                          "gloo")
            return "gloo"
        return backend

    def _ddp_init(self, original):
        emu = self

        def __init__(self, module, *args, **kwargs):
            args = list(args)
            given = {}
            for position, name in ((0, "device_ids"), (1, "output_device")):
                if len(args) > position and args[position] is not None:
                    given[name], args[position] = args[position], None
                if kwargs.get(name) is not None:
                    given[name] = kwargs.pop(name)
            cuda = any(_is_cuda(d) for v in given.values()
                       for d in (v if isinstance(v, (list, tuple)) else [v]))
            if given and cuda and _module_on_cpu(module):
                asked = ", ".join(f"{k}={v!r}" for k, v in given.items())
                emu.note_change(f"DistributedDataParallel({asked})",
                             "dropped: the module is on the CPU")
            elif given:  # not ours to change: as asked
                for position, name in ((0, "device_ids"), (1, "output_device")):
                    if name in given:
                        if len(args) > position:
                            args[position] = given[name]
                        else:
                            kwargs[name] = given[name]
            return original(self, module, *args, **kwargs)

        __init__.__wrapped__ = original
        return __init__

    def _load(self, original):
        emu = self

        def load(f, map_location=None, *args, **kwargs):
            mapped = _map_location(map_location)
            if mapped is not map_location and map_location is not None:
                emu.note_change(f"torch.load(map_location={map_location!r})", "the CPU")
            return original(f, mapped, *args, **kwargs)

        load.__wrapped__ = original
        return load

    def _index_as_cuda(self, original):
        """``model.to(0)``: ``Module.to`` parses its arguments before any tensor moves, and
        torch reads a bare index as a device of the current accelerator, which this machine
        lacks; an index names a CUDA device (torch's convention), so it is parsed as one."""

        def parse_to(*args, **kwargs):
            if args and _is_index(args[0]):
                args = (f"cuda:{args[0]}",) + tuple(args[1:])
            if _is_index(kwargs.get("device")):
                kwargs = dict(kwargs)
                kwargs["device"] = f"cuda:{kwargs['device']}"
            return original(*args, **kwargs)

        parse_to.__wrapped__ = original
        return parse_to

    def _device_context(self, original):
        """``torch.set_default_device("cuda")`` and ``with torch.device("cuda"):``: their mode
        sits under every other one, so it is given the CPU from the start."""
        emu = self

        def __init__(self, device, *args, **kwargs):
            if _is_cuda(device):
                emu.note_change("default device cuda", "the CPU")
                device = "cpu"
            return original(self, device, *args, **kwargs)

        __init__.__wrapped__ = original
        return __init__

    def _generator(self):
        import torch

        real = torch.Generator
        emu = self

        class _Meta(type):
            def __instancecheck__(cls, obj):
                return isinstance(obj, real)

            def __subclasscheck__(cls, sub):
                return issubclass(sub, real)

            def __getattr__(cls, name):  # Generator.manual_seed, ...: the real class's
                return getattr(real, name)

        class Generator(metaclass=_Meta):
            """``torch.Generator(device="cuda")``: a CPU generator."""

            def __new__(cls, device="cpu"):
                if _is_cuda(device):
                    emu.note_change("torch.Generator(device='cuda')", "a CPU generator")
                    device = "cpu"
                return real(device)

        Generator.__name__ = Generator.__qualname__ = "Generator"
        Generator.__module__ = "torch"
        return Generator

    # -- enter / exit -----------------------------------------------------------------------
    def __enter__(self) -> "CudaEmulation":
        import torch
        import torch.distributed as dist
        from torch.amp.autocast_mode import autocast

        patch = self.patcher.patch
        try:
            self._cuda_fakes = self._cuda_functions()
            for name, fake in self._cuda_fakes.items():
                patch(torch.cuda, name, fake)
            for name in ("range_push", "range_pop", "mark"):
                if hasattr(torch.cuda, "nvtx"):
                    patch(torch.cuda.nvtx, name, lambda *a, **k: 0)
            if hasattr(torch.cuda, "nvtx"):
                patch(torch.cuda.nvtx, "range", lambda *a, **k: contextlib.nullcontext())
            accelerator = getattr(torch, "accelerator", None)
            if accelerator is not None:
                for name, fake in self._accelerator_functions().items():
                    if hasattr(accelerator, name):
                        patch(accelerator, name, fake)
            patch(autocast, "__init__", self._autocast_init(autocast.__init__))
            is_enabled, get_dtype = self._autocast_state(torch.is_autocast_enabled,
                                                         torch.get_autocast_dtype)
            patch(torch, "is_autocast_enabled", is_enabled)
            patch(torch, "get_autocast_dtype", get_dtype)
            from torch.amp import autocast_mode

            cast = autocast_mode._cast  # custom_fwd(cast_inputs=) casts the emulated GPU's tensors
            patch(autocast_mode, "_cast",
                  lambda value, device_type, dtype: cast(
                      value, "cpu" if _is_cuda(device_type) else device_type, dtype))
            patch(torch, "load", self._load(torch.load))
            patch(torch._C._nn, "_parse_to", self._index_as_cuda(torch._C._nn._parse_to))
            patch(torch, "Generator", self._generator())
            for storage in (torch.UntypedStorage, torch.TypedStorage):  # map_location callables
                patch(storage, "cuda", _storage_cuda)
            from torch.utils._device import DeviceContext

            patch(DeviceContext, "__init__", self._device_context(DeviceContext.__init__))
            try:
                from torch.utils.data._utils import pin_memory as pin_module

                patch(pin_module, "pin_memory", lambda data, device=None: data)
            except ImportError:
                pass
            try:  # DataParallel runs the module as one device (a function shadows its module)
                import importlib

                data_parallel = importlib.import_module("torch.nn.parallel.data_parallel")
                patch(data_parallel, "_get_available_device_type", lambda: None)
            except (ImportError, AttributeError):
                pass
            if dist.is_available():
                from torch.nn.parallel import DistributedDataParallel as DDP

                patch(dist, "init_process_group", self._init_process_group(dist.init_process_group))
                patch(dist, "new_group", self._new_group(dist.new_group))
                patch(dist, "is_nccl_available", lambda: True)
                patch(DDP, "__init__", self._ddp_init(DDP.__init__))
            self.mode = _mode_class()(self)
            self.mode.__enter__()
        except BaseException:
            self.patcher.undo()
            raise
        return self

    def __exit__(self, *exc) -> None:
        mode, self.mode = self.mode, None
        try:
            if mode is not None:
                mode.__exit__(None, None, None)
        finally:
            self.patcher.undo()

    # -- the report -------------------------------------------------------------------------
    def notes(self) -> list[str]:
        """What the report says about the emulation: that it ran, what the fake answered."""
        asked = "; ".join(f"{q} -> {a}" for q, a in self.answers.items())
        changed = "; ".join(f"{q} -> {a}" for q, a in self.changes.items())
        text = (f"CUDA was emulated (--emulate-cuda): the script took its GPU path with "
                f"{self.gpus} emulated GPU{'s' if self.gpus != 1 else ''}, and every tensor "
                f"lived on the CPU")
        text += f". torch.cuda answered: {asked}" if asked else ". torch.cuda was never asked"
        if changed:
            text += f". Run otherwise than asked: {changed}"
        notes = [text]
        if self.autocast_fallback:
            notes.append(self.autocast_fallback)
        return notes

    def explain_failure(self, exc: BaseException, finder) -> str | None:
        """A run that ended on something the CPU cannot do: which call, at which line of the
        script, and why; None when the failure is the script's own."""
        library = _gpu_only_import(exc)
        call, loc = _failing_call(exc, finder)
        where = f" at {loc.path}:{loc.line}" if loc is not None else ""
        if library is not None:
            return (f"--emulate-cuda cannot emulate {GPU_ONLY_LIBRARIES[library]}: the script "
                    f"imports or calls {library}{where}, which needs a real GPU")
        text = _text(exc)
        if not any(m in text for m in _GPU_ONLY_MESSAGES) or _raised_by_script(exc, finder):
            return None
        if "gloo" in text.lower() or "nccl" in text.lower():
            why = "an NCCL-only collective (gloo, which stands in for nccl, does not have it)"
        else:
            why = "it needs a real GPU (a CUDA kernel or a part of torch.cuda not emulated)"
        return f"--emulate-cuda cannot emulate {call or 'a call'}{where}: {why}"


_MODE_CLASS = None


def _mode_class():
    global _MODE_CLASS
    if _MODE_CLASS is not None:
        return _MODE_CLASS
    import torch
    from torch.overrides import TorchFunctionMode

    Tensor = torch.Tensor
    to, cuda, cpu = Tensor.to, Tensor.cuda, Tensor.cpu
    pin, record_stream = Tensor.pin_memory, Tensor.record_stream
    is_pinned = Tensor.is_pinned

    class DeviceMode(TorchFunctionMode):
        def __init__(self, emulation: CudaEmulation):
            super().__init__()
            self.storages = emulation.storages
            self.emulation = emulation

        def __torch_function__(self, func, types, args=(), kwargs=None):
            func = self.emulation.originals.original_of(func)
            if kwargs is None:
                kwargs = {}
            if func is to:
                return self._to(func, args, kwargs)
            if func is cuda:
                return self._cuda(args, kwargs)
            if func is cpu:
                if args and args[0] in self.storages:  # off the GPU: a copy, as on a real one
                    return to(args[0], "cpu", copy=True, **kwargs)
                return func(*args, **kwargs)
            if func is pin:
                return args[0]
            if func is is_pinned:
                return False
            if func is record_stream:
                return None
            if kwargs:
                device = kwargs.get("device")
                if device is not None and _is_cuda(device):
                    kwargs = dict(kwargs)
                    kwargs["device"] = "cpu"
                    if kwargs.get("pin_memory"):
                        kwargs["pin_memory"] = False
                    out = func(*args, **kwargs)
                    if isinstance(out, Tensor):
                        self.storages.add(out)
                    return out
                if kwargs.get("pin_memory"):
                    kwargs = dict(kwargs)
                    kwargs["pin_memory"] = False
            return func(*args, **kwargs)

        def _to(self, func, args, kwargs):
            tensor, rest = args[0], list(args[1:])
            target = None
            if rest and not isinstance(rest[0], (torch.dtype, Tensor)) and \
                    (_is_cuda(rest[0]) or _is_cpu(rest[0])):
                target, rest[0] = rest[0], "cpu"
            elif kwargs.get("device") is not None:
                target = kwargs["device"]
                if _is_cuda(target):
                    kwargs = dict(kwargs)
                    kwargs["device"] = "cpu"
            if target is None:
                return func(tensor, *rest, **kwargs)
            on_gpu = tensor in self.storages
            if _is_cuda(target):
                if on_gpu:
                    return func(tensor, *rest, **kwargs)
                out = func(tensor, *rest, **_copying(rest, kwargs))
                self.storages.add(out)
                return out
            if on_gpu:  # to the host: a copy
                return func(tensor, *rest, **_copying(rest, kwargs))
            return func(tensor, *rest, **kwargs)

        def _cuda(self, args, kwargs):
            tensor = args[0]
            if tensor in self.storages:
                return tensor
            options = {k: v for k, v in kwargs.items() if k in ("non_blocking", "memory_format")}
            if len(args) > 2:
                options["non_blocking"] = args[2]
            out = to(tensor, "cpu", copy=True, **options)
            self.storages.add(out)
            return out

    _MODE_CLASS = DeviceMode
    return DeviceMode


def _caller_module() -> str:
    """The module of the first caller outside this one."""
    import sys

    frame = sys._getframe(2)
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        frame = frame.f_back
    return (frame.f_globals.get("__name__") or "") if frame is not None else ""


_COMPILER_MODULES = ("torch._dynamo", "torch._inductor", "torch.utils._triton", "torch._functorch")


def _asked_by_compiler() -> bool:
    """Whether torch.compile's own code asks (it must compile for the CPU the tensors are on)."""
    import sys

    try:
        caller = sys._getframe(2).f_globals.get("__name__", "") or ""
    except ValueError:
        return False
    return caller.startswith(_COMPILER_MODULES)


def torch_cuda_is_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def accelerator_is_available() -> bool:
    import torch

    accelerator = getattr(torch, "accelerator", None)
    return bool(accelerator is not None and accelerator.is_available())


def _copying(rest: list, kwargs: dict) -> dict:
    """``Tensor.to``'s keywords with ``copy=True`` (unless copy was given positionally)."""
    if len(rest) >= 4 or "copy" in kwargs:
        return kwargs
    return {**kwargs, "copy": True}


def _storage_cuda(self, device=None, non_blocking=False, **_kwargs):
    """``storage.cuda()`` (a ``torch.load`` map_location callable): the storage, on the CPU."""
    return self


def _module_on_cpu(module) -> bool:
    try:
        devices = {p.device.type for p in module.parameters()}
    except Exception:
        return True
    return devices <= {"cpu"}


def _map_location(location):
    if location is None or _is_cuda(location):
        return "cpu"
    if isinstance(location, dict):
        return {k: ("cpu" if _is_cuda(v) else v) for k, v in location.items()}
    return location


def _cpu_autocast_dtypes() -> set:
    """The dtypes CPU autocast takes in this torch (it warns and disables itself otherwise)."""
    import warnings

    import torch

    supported = set()
    for dtype in (torch.float16, torch.bfloat16):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                probe = torch.amp.autocast("cpu", dtype=dtype)  # made, never entered
            except Exception:
                continue
        if getattr(probe, "_enabled", False) and not caught:
            supported.add(dtype)
    return supported or {torch.bfloat16}


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _text(exc: BaseException) -> str:
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:
        return type(exc).__name__


def _gpu_only_import(exc: BaseException) -> str | None:
    if isinstance(exc, ImportError):
        name = (getattr(exc, "name", None) or "").split(".")[0]
        if name in GPU_ONLY_LIBRARIES:
            return name
    text = _text(exc)
    for name in GPU_ONLY_LIBRARIES:
        if isinstance(exc, ImportError) and f"'{name}" in text:
            return name
    # a call into such a library that failed inside it
    for frame, _line in traceback.walk_tb(exc.__traceback__):
        module = frame.f_globals.get("__name__", "") or ""
        top = module.split(".")[0]
        if top in GPU_ONLY_LIBRARIES and top != "nvidia":
            return top
    return None


def _raised_by_script(exc: BaseException, finder) -> bool:
    """The script's own ``raise`` (its message is its own, whatever it says about CUDA)."""
    frames = list(traceback.walk_tb(exc.__traceback__))
    if not frames:
        return False
    frame, line = frames[-1]
    if not finder.is_user_file(frame.f_code.co_filename):
        return False
    return linecache.getline(frame.f_code.co_filename, line).lstrip().startswith("raise")


def _failing_call(exc: BaseException, finder):
    """The script's call that failed, as its line reads (with the library function it failed
    in, when it failed in Python), and the script's location."""
    frames = list(traceback.walk_tb(exc.__traceback__))
    last_user = None
    for i, (frame, _line) in enumerate(frames):
        if finder.is_user_file(frame.f_code.co_filename):
            last_user = i
    loc = finder.from_traceback(exc.__traceback__)
    if last_user is None:
        return None, loc
    frame, line = frames[last_user]
    text = linecache.getline(frame.f_code.co_filename, line).strip()
    call = f"`{text}`" if text else "a call"
    if last_user + 1 < len(frames):
        inner = frames[last_user + 1][0]
        call += f" (in {inner.f_globals.get('__name__', '?')}.{inner.f_code.co_name})"
    return call, loc


def needs_cuda_hint(error: dict | None, notes_text: str = "") -> str | None:
    """Without ``--emulate-cuda``: a note suggesting it when the script failed for want of a
    GPU ("Torch not compiled with CUDA enabled", nccl, ``assert torch.cuda.is_available()``, a
    CUDA binding a CPU build lacks)."""
    if not error:
        return None
    message = str(error.get("message") or "")
    wants = any(m in message for m in ("Torch not compiled with CUDA enabled",
                                       "Found no NVIDIA driver", "no CUDA GPUs",
                                       "without ATen_cuda library", "NCCL", "nccl",
                                       # pin_memory() on a machine without an accelerator
                                       "Cannot access accelerator device when none is available",
                                       # Lightning's Trainer / Fabric(accelerator="cuda" or "gpu")
                                       "`CUDAAccelerator` can not run on your system",
                                       "No supported gpu backend found"))
    # a CPU build has no CUDA bindings: torch.cuda.set_device(0) and its kin fail on
    # "module 'torch._C' has no attribute '_cuda_setDevice'"
    wants = wants or (error.get("type") == "AttributeError" and "torch._C" in message
                      and "'_cuda" in message)
    location = error.get("location") or {}
    if not wants and error.get("type") == "AssertionError" and location.get("path"):
        line = _source_line(location)
        wants = "cuda" in line
    if not wants and error.get("type") == "SystemExit" and location.get("path"):
        # `if not torch.cuda.is_available(): raise SystemExit("CUDA required")`
        wants = "cuda" in _source_line(location).lower()
    if not wants:
        return None
    return ("the script needs a GPU (CUDA or nccl), which this machine lacks: `graddoctor check "
            "--emulate-cuda` runs its GPU path unchanged with every tensor on the CPU (see "
            "docs/emulate-cuda.md)")


def _source_line(location: dict) -> str:
    path = location.get("path") or ""
    try:
        return linecache.getline(path, int(location.get("line") or 0))
    except Exception:
        return ""
