"""graddoctor's start-up hook for the worker processes a checked script starts with
``multiprocessing`` (``mp.spawn``, spawn / forkserver contexts): graddoctor/run/workers.py puts this
folder first on the children's PYTHONPATH, the way ``coverage`` measures subprocesses.

Inert unless ``GRADDOCTOR_CHILD`` is set *and* this interpreter is a multiprocessing child
(``--multiprocessing-fork`` on its command line); any other ``sitecustomize`` on the path is run
first, as if this one were not there.
"""

import os
import sys


def _chain() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


try:
    _chain()
except Exception as exc:  # the other sitecustomize's failure, reported as python would
    sys.stderr.write(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
                     f"{type(exc).__name__}: {exc}\n")

if os.environ.get("GRADDOCTOR_CHILD") and "--multiprocessing-fork" in sys.argv:
    try:
        import json

        _root = json.loads(os.environ["GRADDOCTOR_CHILD"]).get("root")
        if _root and _root not in sys.path:
            sys.path.append(_root)
        from graddoctor.run.in_worker import start_child

        start_child()
    except Exception as exc:  # never break the user's worker
        sys.stderr.write(f"graddoctor: could not instrument worker pid {os.getpid()}: "
                         f"{type(exc).__name__}: {exc}\n")
