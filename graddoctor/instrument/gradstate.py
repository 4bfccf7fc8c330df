"""The gradient state: what each tracked tensor's ``.grad`` was when graddoctor last saw it.

The backward, optimizer, clip and GradScaler watchers tell it what they saw and did
(``backward_wrote``, ``cleared``, ``after_step``, ``note_known``, ``vouch_finite``, ...), each
call with the lists its own pass built, so the per-tensor loops stay inside one call; and they
read it to judge a ``.grad`` (accumulated, fresh, changed behind graddoctor's back, vouched
finite). It is the recorder's (``Recorder.grads``); only its own methods write it.

A state is ``(id(grad), grad._version)``: the same tensor object unchanged since. The passes
over every tracked tensor run each step, so they are written as ``map``s over C functions
(attribute getters, identity tests, ``itertools.compress``): their cost per tensor is a few C
calls, not Python bytecode, and they allocate no container per tensor.
"""

from __future__ import annotations

import operator
from itertools import compress, repeat
from operator import add, is_, is_not, not_, sub

import torch

from .identities import Identities, call

Tensor = torch.Tensor

_version = operator.attrgetter("_version")
_requires_grad = operator.attrgetter("requires_grad")

# steps of one of torch's optimizers that must each bump every parameter with a grad by the same
# count (and the others by none) before the versions its later steps leave are predicted, not read
BUMP_TRUSTED_AFTER = 3


def bumped(pre: list, bump: int, has) -> list:
    """``pre`` (versions before a step) plus ``bump`` where ``has`` (None: everywhere)."""
    if has is None:
        return list(map(add, pre, repeat(bump)))
    return list(map(add, pre, map(bump.__mul__, has)))  # (True * bump, False * bump)


def tensors_of(refs: list, pids: list) -> list:
    """The tracked tensors ``pids`` (None for one that died), from ``Identities.refs``."""
    return list(map(call, map(refs.__getitem__, pids)))


_modes_on_stack = torch._C._len_torch_function_stack
_pop_mode = torch._C._pop_torch_function_stack
_push_mode = torch._C._push_on_torch_function_stack


def grads_of(tensors: list) -> list:
    """Each tensor's ``.grad`` (None for a tensor that is None). Read past any torch function
    mode on the stack (a watcher's window between a forward and its backward, the script's
    own): ``.grad`` is a property that dispatches to the mode, one Python call per tensor for
    graddoctor's own read; the modes are lifted off and put back in their order (not exited:
    they never hear of it)."""
    if not _modes_on_stack():
        return list(map(getattr, tensors, repeat("grad"), repeat(None)))
    lifted = []
    try:
        while _modes_on_stack():
            lifted.append(_pop_mode())
        return list(map(getattr, tensors, repeat("grad"), repeat(None)))
    finally:
        for mode in reversed(lifted):
            _push_mode(mode)


def states_of(grads: list):
    """``(id(grad), version)`` of each grad (none None), lazily (``version``: a DTensor's local
    shard's)."""
    if all(map(is_, map(type, grads), repeat(Tensor))):
        return zip(map(id, grads), map(_version, grads))
    return zip(map(id, grads), map(version, grads))


def local(grad):
    """A ``DTensor``'s local shard (FSDP2, tensor parallelism: the reduce-scatter writes a
    sharded gradient in place into it, and reading it needs no communication); any other
    tensor itself. Hot loops test ``type(grad) is Tensor`` first and call this only otherwise."""
    return getattr(grad, "_local_tensor", grad)


def version(grad) -> int:
    """A gradient's data version: a DTensor's wrapper keeps its version when FSDP adds into its
    local shard, so the shard's is read."""
    return grad._version if type(grad) is Tensor else local(grad)._version


class GradState:
    """The gradient state of every tracked tensor, by pid (see the module's docstring)."""

    def __init__(self, tensors: Identities, requires_grad: dict[int, bool]):
        self.tensors = tensors  # the recorder's tracked tensors: pid -> tensor
        self._requires_grad = requires_grad  # the recorder's, noted again at each step
        # what p.grad was when we last saw it: pid -> (id(grad), grad._version)
        self._known: dict[int, tuple[int, int]] = {}
        self._zeroed: dict[int, tuple[int, int]] = {}  # left by zero_grad(set_to_none=False)
        # each owned parameter's ``_version`` right after the latest step that owns it: a
        # different one at the next step means it was changed in place by hand in between (EMA)
        self._param_version: dict[int, int] = {}
        # grads known to be finite: pid -> ((id(grad), grad._version), conditional). Vouched for
        # by a watched op that already looked at every value (clip_grad_norm_ with a finite total,
        # GradScaler.unscale_); valid while the grad is in exactly that state. ``conditional``:
        # only if the optimizer step then runs inside GradScaler.step, which runs it only when
        # unscale_ found no inf/NaN. Lets the step skip its own norm pass (see optim.py).
        self._finite: dict[int, tuple[tuple[int, int], bool]] = {}
        # the skim of a long steady state (instrument/fold.py ``SKIM_AFTER``): the pids whose
        # grads skimmed backwards wrote, and the parameters skimmed steps stepped, without
        # noting them here. Every read or write below catches up first (``catch_up``).
        self.behind_grads: list | None = None
        self.behind_params: list | None = None
        # the pids of the grads behind that a skimmed clip found finite (its total norm), to
        # be vouched for as they are when caught up: what its full path would have vouched
        self.behind_vouched: list | None = None
        # (pids, states, conditional) of the latest ``vouch_finite`` while every entry it wrote
        # in ``_finite`` stands as written (None once any entry may have changed): a step whose
        # grads are exactly those (``vouched_exactly``) compares two lists, not every entry
        self.last_vouch: tuple | None = None
        # (pids, requires) of the latest ``note_requires_grad`` while the ledger still holds
        # those values for those pids (None once another writer may have changed one): a step
        # that reads the same list notes nothing
        self.requires_noted: tuple | None = None
        # pid lists (an optimizer's own, never changed: ``Recorder.add_params``) -> the weak
        # references of their tensors, so a step reads its tensors in one pass
        self._refs_of: dict[int, tuple[list, list]] = {}
        # pid lists (an optimizer's own) -> (the list, the version bump its steps gave each
        # parameter with a grad, how many steps in a row did; -1: one did not): ``after_step``
        self._bumps: dict[int, tuple[list, int, int]] = {}
        # the versions the latest steps left, predicted and not yet written into
        # ``_param_version``, oldest first: id(pids) -> (pids, versions before, bump, has)
        self._stepped: dict[int, tuple[list, list, int, list | None]] = {}

    # the ledger, caught up with what skimmed hooks did not note (one test when nothing is behind)
    @property
    def known(self) -> dict:
        if self.behind_grads is not None or self.behind_params is not None:
            self.catch_up()
        return self._known

    @property
    def zeroed(self) -> dict:
        if self.behind_grads is not None or self.behind_params is not None:
            self.catch_up()
        return self._zeroed

    @property
    def param_version(self) -> dict:
        if self.behind_grads is not None or self.behind_params is not None:
            self.catch_up()
        if self._stepped:
            self._settle_versions()
        return self._param_version

    def _settle_versions(self) -> None:
        """Write the predicted versions of the latest steps (``_stepped``) into
        ``_param_version``, in the order of their steps."""
        stepped, self._stepped = self._stepped, {}
        for pids, pre, bump, has in stepped.values():
            self._param_version.update(zip(pids, bumped(pre, bump, has)))

    def versions_after_step(self, pids: list) -> list | None:
        """The version each of ``pids`` (an optimizer's own list, the very object) had right
        after its latest step, predicted (``_versions_after``), when that is all the ledger
        holds beyond what it wrote: one list, no dict lookup per parameter. None otherwise
        (``param_version``)."""
        stepped = self._stepped
        if (len(stepped) != 1 or self.behind_grads is not None
                or self.behind_params is not None):
            return None
        entry = stepped.get(id(pids))
        if entry is None or entry[0] is not pids:
            return None
        return bumped(entry[1], entry[2], entry[3])

    @property
    def finite(self) -> dict:
        if self.behind_grads is not None or self.behind_params is not None:
            self.catch_up()
        return self._finite

    @property
    def requires_grad(self) -> dict:
        if self.behind_grads is not None or self.behind_params is not None:
            self.catch_up()
        return self._requires_grad

    def any_vouched(self) -> bool:
        """Whether any grad is vouched finite (``finite``), read without catching up (a
        catch-up only removes vouchers)."""
        return bool(self._finite)

    def skimmed_backward(self, pids: list) -> None:
        """A skimmed backward wrote the grads of ``pids`` unseen (``catch_up`` notes them)."""
        self.behind_grads = pids
        self.behind_vouched = None

    def skimmed_clip(self, pids: list) -> None:
        """A skimmed ``clip_grad_norm_`` with a finite total clipped the grads of ``pids`` (all
        behind) in place, unseen: caught up, they are vouched finite as the clip's full path
        vouches them (a step that then goes its full path skips its norm pass alike)."""
        self.behind_vouched = pids

    def skimmed_step(self, pids: list) -> None:
        """A skimmed step stepped the parameters ``pids`` unseen (``catch_up`` notes them)."""
        self.behind_params = pids

    def catch_up(self) -> None:
        """Re-base the ledger on what is there now, without judging it, after skimmed turns
        (``behind_grads``, ``behind_params``): the grads the skimmed backwards wrote are known
        as they are now, the stepped parameters' versions and requires_grad are as they are
        now. What skimmed turns did to them by hand is not seen (docs/performance.md, the skim)."""
        grads_pids, self.behind_grads = self.behind_grads, None
        params, self.behind_params = self.behind_params, None
        vouched, self.behind_vouched = self.behind_vouched, None
        self.last_vouch = self.requires_noted = None
        refs = self.tensors.refs
        if params is not None:
            if self._stepped:
                self._settle_versions()
            tensors = tensors_of(refs, params)
            if not all(map(is_not, tensors, repeat(None))):
                alive = list(map(is_not, tensors, repeat(None)))
                params, tensors = list(compress(params, alive)), list(compress(tensors, alive))
            self._requires_grad.update(zip(params, map(_requires_grad, tensors)))
            self._param_version.update(zip(params, map(_version, tensors)))
        if grads_pids is not None:
            if self._zeroed:
                list(map(self._zeroed.pop, grads_pids, repeat(None)))
            if self._finite:
                list(map(self._finite.pop, grads_pids, repeat(None)))
            grads = grads_of(tensors_of(refs, grads_pids))
            with_grad = list(map(is_not, grads, repeat(None)))
            if not all(with_grad):
                grads_pids, grads = list(compress(grads_pids, with_grad)), list(compress(grads, with_grad))
            if vouched is None:
                self._known.update(zip(grads_pids, states_of(grads)))
            else:
                states = list(states_of(grads))
                self._known.update(zip(grads_pids, states))
                if vouched != grads_pids:
                    by_pid = dict(zip(grads_pids, states))
                    vouched = [pid for pid in vouched if pid in by_pid]
                    states = list(map(by_pid.__getitem__, vouched))
                self.vouch_finite(vouched, states)

    def grad_states(self, pids) -> tuple[list, list]:
        """``(pids, states)``, two parallel lists: each pid whose tensor has a grad and that
        grad's ``(id(grad), grad._version)``. The loops that run every step go through here:
        ``map``s that run in C, no Python per tensor."""
        pids = pids if type(pids) is list else list(pids)
        grads = grads_of(tensors_of(self.tensors.refs, pids))
        with_grad = list(map(is_not, grads, repeat(None)))
        if not all(with_grad):
            pids, grads = list(compress(pids, with_grad)), list(compress(grads, with_grad))
        return pids, list(states_of(grads))

    def after_step(self, pids, read=None, keeps_grads: bool = False,
                   untouched: bool | None = None, predictable: bool = False) -> list[int]:
        """Per step, once per owned parameter: note requires_grad (the end-of-run ``param``
        events need it after the script's tensors are gone), refresh what its grad looks like
        after the step, note its ``_version`` (``param_version``), and return the pids that had
        no gradient. ``map``s that run in C, no Python per parameter.

        ``read``: what the step's pre hook read (``optim.StepGrads``). When the step left every
        ``.grad`` as it got it (the same tensors, at the same versions), its states and
        requires_grad stand: only the parameters' versions are read. ``keeps_grads``: the step
        is one of torch's optimizers', which never set a ``.grad`` (only a version is compared).
        ``untouched``: whether the step left every grad's version as ``read`` has it, when the
        caller knows (True: not read again); None: compared here. ``predictable``: a plain
        call of one of torch's optimizers with no step hooks of its own (``_versions_after``)."""
        pids = pids if type(pids) is list else list(pids)
        owned = read.owned if read is not None and read.states is not None else None
        if owned is not None and owned[0] is pids and len(owned[1]) == len(pids):
            _pids, tensors, before = owned
            if ((keeps_grads or all(map(is_, grads_of(tensors), before)))
                    and (untouched if untouched is not None else read.untouched())):
                self._versions_after(pids, tensors, read, keeps_grads and predictable)
                if not read.known:
                    self.known.update(zip(read.pids, read.states))
                return read.without
        tensors = tensors_of(self.tensors.refs, pids)
        if not all(map(is_not, tensors, repeat(None))):  # some died: left as they were
            alive = list(map(is_not, tensors, repeat(None)))
            pids, tensors = list(compress(pids, alive)), list(compress(tensors, alive))
        self.requires_noted = None
        self.requires_grad.update(zip(pids, map(_requires_grad, tensors)))
        self.param_version.update(zip(pids, map(_version, tensors)))
        grads = grads_of(tensors)
        with_grad = list(map(is_not, grads, repeat(None)))
        if all(with_grad):
            without = []
        else:
            without = list(compress(pids, map(is_, grads, repeat(None))))
            pids, grads = list(compress(pids, with_grad)), list(compress(grads, with_grad))
        self.known.update(zip(pids, states_of(grads)))
        return without

    def _versions_after(self, pids: list, tensors: list, read, predictable: bool) -> None:
        """Note each owned parameter's ``_version`` right after a step (``param_version``).

        Past the first steps this pass and its writes are the step's post hook's costliest part
        at thousands of tensors: every parameter and every entry of the ledger touched once more,
        all of them out of the CPU's caches after the optimizer's own pass over its state.
        Torch's optimizers bump each parameter they update by a count their configuration fixes
        (an in-place op per update, weight decay's included) and skip those without a grad. Once
        ``BUMP_TRUSTED_AFTER`` steps in a row gave every parameter with a grad the same bump and
        the others none (against the versions the pre hook read, ``read.param_versions``), a
        later step's versions are kept as that list and bump (``_stepped``), written into the
        ledger only when something reads it; the next step's pre hook compares whole lists
        (``versions_after_step``). One step that did otherwise, and the versions are read after
        every step, as before. A parameter changed by hand between steps is still seen at the
        next pre hook: its version is then not the one predicted."""
        pre = read.param_versions if predictable else None
        if pre is None or len(pre) != len(pids):
            self.param_version.update(zip(pids, map(_version, tensors)))
            return
        has = read.has  # which had a grad; None: every one
        learned = self._bumps.get(id(pids))
        if learned is not None and learned[0] is not pids:
            learned = None
        if learned is not None and learned[2] >= BUMP_TRUSTED_AFTER:
            stepped = self._stepped
            stepped.pop(id(pids), None)  # (re-inserted last: the newest)
            stepped[id(pids)] = (pids, pre, learned[1], has)
            return
        post = list(map(_version, tensors))
        self.param_version.update(zip(pids, post))
        if learned is not None and learned[2] < 0:
            return
        deltas = list(map(sub, post, pre))
        if has is None:
            with_grad, without = deltas, ()
        else:
            with_grad = list(compress(deltas, has))
            without = list(compress(deltas, map(not_, has)))
        if not with_grad:  # nothing stepped: nothing learned
            return
        bump = with_grad[0]
        same = (bump > 0 and with_grad.count(bump) == len(with_grad) and not any(without)
                and (learned is None or learned[1] == bump))
        if len(self._bumps) >= 16 and id(pids) not in self._bumps:
            del self._bumps[next(iter(self._bumps))]
        self._bumps[id(pids)] = (pids, bump, (learned[2] if learned is not None else 0) + 1
                                 if same else -1)

    def note_param_versions(self, pids: list, tensors: list) -> None:
        """Each parameter's ``_version`` right after a step that owns it (``param_version``),
        what ``after_step`` notes when the step left its grads as it got them."""
        self.param_version.update(zip(pids, map(_version, tensors)))

    def note_requires_grad(self, pids: list, requires: list) -> None:
        """Each parameter's ``requires_grad`` (parallel lists), read before a step. The same
        values for the same pid list as the latest call, and no other writer since: the
        ledger holds them already (one list comparison, no pass)."""
        noted = self.requires_noted
        if (noted is not None and noted[0] is pids and noted[1] == requires
                and self.behind_grads is None and self.behind_params is None):
            return
        self.requires_grad.update(zip(pids, requires))
        self.requires_noted = (pids, requires)

    def refs_of(self, pids: list) -> list:
        """The weak references of the tracked tensors ``pids`` (``Identities.refs``), kept per
        pid list (an optimizer's own list, which is replaced, never changed: the list itself is
        held, so its id is not reused): a step's tensors in one pass
        (``map(call, refs_of(pids))``) rather than two."""
        kept = self._refs_of.get(id(pids))
        if kept is not None and kept[0] is pids:
            return kept[1]
        refs = list(map(self.tensors.refs.__getitem__, pids))
        if len(self._refs_of) >= 16:  # optimizers rebuilt again and again: the oldest go
            del self._refs_of[next(iter(self._refs_of))]
        self._refs_of[id(pids)] = (pids, refs)
        return refs

    def vouched_exactly(self, pids: list, states: list) -> bool | None:
        """Whether ``pids`` at ``states`` (parallel lists) are exactly what the latest
        ``vouch_finite`` vouched for, with its entries all standing: its ``conditional`` then
        (True: only inside GradScaler.step); None when not (``finite``, entry by entry)."""
        vouch = self.last_vouch
        if (vouch is not None and self.behind_grads is None and self.behind_params is None
                and vouch[0] == pids and vouch[1] == states):
            return vouch[2]
        return None

    def note_known(self, pids: list, states: list) -> None:
        """States (parallel to ``pids``) read after an in-place change graddoctor watched: the
        grads as they are now are still the accumulated ones, not a manual clear."""
        self.known.update(zip(pids, states))

    def cleared(self, params) -> list[int]:
        """A ``zero_grad`` has just cleared ``params``: their grads are fresh from now on, and
        one zero-filled in place (``set_to_none=False``) is remembered exactly as it was left.
        Returns the pids of the tracked ones."""
        params = params if type(params) is list else list(params)
        pids = self.tensors.numbers(params)
        if None in pids:
            tracked = list(map(is_not, pids, repeat(None)))
            pids, params = list(compress(pids, tracked)), list(compress(params, tracked))
        known = self.known
        if known:
            list(map(known.pop, pids, repeat(None)))
        grads = grads_of(params)
        with_grad = list(map(is_not, grads, repeat(None)))
        if any(with_grad):
            self.zeroed.update(zip(compress(pids, with_grad),
                                   states_of(list(compress(grads, with_grad)))))
        return pids

    def backward_wrote(self, written: list, pids: list, states: list) -> None:
        """A backward has just written the grads of the pids in ``written``; ``states``
        (parallel to ``pids``) are those it left a grad in. Once per backward: the passes run
        here, over what the backward watcher's own pass collected."""
        zeroed, finite = self.zeroed, self.finite
        # a new gradient: an old state could match it by a reused id (a voucher: a NaN missed)
        if zeroed:
            list(map(zeroed.pop, written, repeat(None)))
        if finite:
            self.last_vouch = None
            list(map(finite.pop, written, repeat(None)))
        self.known.update(zip(pids, states))

    def refresh_known(self, pids) -> tuple[list, list]:
        """After an in-place change we made or watched (clip, unscale, step): the grad as it is
        now is still the accumulated one, not a manual clear. Returns what it read
        (``grad_states``)."""
        pids, states = self.grad_states(pids)
        self.known.update(zip(pids, states))
        return pids, states

    def vouch_finite(self, pids: list, states: list, conditional: bool = False) -> None:
        """A watched op has just seen every value of these grads finite (see ``finite``).
        ``pids`` and ``states`` are held as they are (``last_vouch``): not changed afterwards."""
        self.finite.update(zip(pids, zip(states, repeat(conditional))))
        self.last_vouch = (pids, states, conditional)

    def carry_finite(self, before: dict, pids: list, states: list) -> None:
        """A watched op that keeps finite grads finite (clipping: a finite factor or a clamp)
        went from ``before`` (pid -> state) to ``states`` (parallel to ``pids``): grads vouched
        for before still are."""
        finite = self.finite
        if not finite:
            return
        self.last_vouch = None
        for pid, state in zip(pids, states):
            vouched = finite.get(pid)
            if vouched is not None:
                if vouched[0] == before.get(pid):
                    finite[pid] = (state, vouched[1])
                else:
                    del finite[pid]
