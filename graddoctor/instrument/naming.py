"""Naming the tracked parameters after the user's own variables, at the moments the models are
alive: an optimizer's construction (the constructing frames' variables only), each optimizer's
first step (the stepping frame's variables, then the heap), a learnable tensor tracked late, and
the end of the run (the script's globals). ``instrument/names.py`` does the naming itself; this
watcher decides when, from the optimizer and backward watchers' topics.
"""

from __future__ import annotations

import threading

from .names import LiveModules, emit_param_events, name_parameters, user_variables
from .recorder import Recorder
from .registration import find_unregistered
from .topics import LEAF_TRACKED, PARAMS_ADDED, STEPPED

# heap scans for learnable tensors tracked late: a tensor made afresh each update that lives
# across several backwards (PGD's perturbation, an input optimised in an inner loop) is tracked
# at every update, and a scan of a large heap costs a tenth of a second or more; the later ones
# are named from the variables on the stack, and all of them at the end of the run
NEW_LEAF_SCANS = 3


class ParamNamer:
    def __init__(self, rec: Recorder, optimizers):
        self.rec = rec
        self.optimizers = optimizers  # the optimizer watcher: ``owned_pids()``
        self._named: set[int] = set()  # optimizers whose parameters were named at their first step
        self.step_threads: set[int] = set()  # the threads the optimizers' first steps ran in
        self._script_globals: dict | None = None  # the script's variables (``name_from``)
        self._unregistered: set[int] = set()  # pids an ``unregistered`` event has named
        self._leaf_scans_left = NEW_LEAF_SCANS
        rec.subscribe(STEPPED, self._name_after_first_step)
        rec.subscribe(PARAMS_ADDED, self._name_at_construction)
        rec.subscribe(LEAF_TRACKED, self._name_new_leaf)

    def _name_at_construction(self, opt, pids) -> None:
        # from the variables of the constructing frames only (no gc scan): a model that lives in
        # a thread's or a function's locals may never step where another thread can see it
        rec = self.rec
        if opt not in self._named:  # its first step is still to come
            rec.resume(STEPPED, self._name_after_first_step)
        if any(p not in rec.param_names for p in pids):
            name_parameters(rec, use_gc=False)

    def _name_after_first_step(self, opt, optimizer) -> None:
        # modules are alive now (they may be gone when a main() function has returned), and held
        # by the stepping frame's variables: each optimizer's first step, as models trained in
        # threads are each seen only from their own thread's stack
        if opt not in self._named:
            first = not self._named
            self._named.add(opt)
            self.step_threads.add(threading.get_ident())
            rec = self.rec
            live = LiveModules()  # one heap scan at most for both
            if first or any(p not in rec.param_names for p in rec.opt_params.get(opt, ())):
                name_parameters(rec, live=live)
            # plain lists of modules: while the model is alive (main() may return before the end)
            find_unregistered(rec, user_variables(rec), self.optimizers.owned_pids(),
                              self._unregistered, live)
            if all(other in self._named for other in rec.opt_params):
                # each optimizer's first step seen: off STEPPED until a new one is registered
                rec.retire(STEPPED, self._name_after_first_step)

    def _name_new_leaf(self) -> None:
        # a learnable tensor left out of the optimizer, tracked at its second backward: named,
        # and found in its module, while the model is surely alive (the heap: NEW_LEAF_SCANS times)
        rec = self.rec
        try:
            live = LiveModules(scan=self._leaf_scans_left > 0)
            name_parameters(rec, live=live)
            find_unregistered(rec, user_variables(rec), self.optimizers.owned_pids(),
                              self._unregistered, live)
            self._leaf_scans_left -= live.scanned
        except Exception as exc:
            rec.internal_error("naming a tensor", exc)

    def name_from(self, variables: dict | None) -> None:
        """The script's variables once it has run: parameters still unnamed on exit are named
        after them first (held until then only)."""
        self._script_globals = variables

    def close(self) -> None:
        """The end of the run: the parameters still unnamed are named (the script's variables
        first), the unregistered ones found, and each tracked tensor's ``param`` event emitted."""
        rec = self.rec
        try:
            variables, self._script_globals = self._script_globals, None
            live = LiveModules()
            name_parameters(rec, variables or {}, live=live)
            find_unregistered(rec, variables, self.optimizers.owned_pids(), self._unregistered, live)
            emit_param_events(rec)
        except Exception as error:
            rec.internal_error("naming parameters", error)
