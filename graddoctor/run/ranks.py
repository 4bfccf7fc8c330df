"""Checking a distributed run: every rank records its own run, rank 0 reports for all.

Under a launcher (``torchrun``, ``python -m torch.distributed.run``, or ``graddoctor check
--nproc-per-node N``, which calls ``torch.distributed.run`` as a library) each rank runs
``graddoctor check`` on its own process of the script. At the end:

* every rank other than 0 hands its report (JSON) to rank 0 and exits 0, whatever it found:
  a non-zero exit makes the launcher kill the other ranks before they have reported;
* rank 0 waits for the others' reports, merges them (report/merge.py: each finding says which
  ranks saw it) and writes the one report; its exit code is the merged verdict's.

The reports travel through the launcher's own key-value store (torchrun's agent ``TCPStore``
at ``MASTER_ADDR:MASTER_PORT``, alive until every rank has ended, on every node), never
through the script's process group, which may be destroyed, broken or never created. Where
there is no such store (SLURM's ``srun``, mpirun), or with ``-o`` holding ``{rank}``, each
rank writes its own report file and ``graddoctor merge`` joins them.

A rank's report is final before its script's teardown: at ``destroy_process_group()``
(run/interim.py ``EarlyReport``), else when the script ends, with the script's objects held
until the report is handed over; a rank stuck after that is not waited for. Rank 0 tells a
dead rank from a slow one within a second (``Exchange``) and takes only its own run's
reports (``run_id``, script, argv, world size). SIGTERM makes every rank report what it had
(``reporting_on_sigterm``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
from dataclasses import dataclass, replace

from ..report.json_format import from_dict
from ..findings import spans
from ..report.merge import Part, communication_error, merge, missing_entry, single
from ..status import RunStatus
from ..rules.engine import selected_rules

STORE_TIMEOUT_S = 30.0  # connecting to the launcher's store
POLL_S = 0.1


@dataclass(frozen=True)
class RankEnv:
    rank: int
    world_size: int
    store: tuple[str, int] | None  # the launcher's agent store (torchrun), or None
    prefix: str  # keys of this run in the store
    run_id: str | None = None  # this run, as the launcher names it (stale files: another's)

    @property
    def label(self) -> str:
        return f"rank {self.rank}"


def rank_env(environ=None) -> RankEnv | None:
    """This process's rank when it runs under a launcher with more than one process, else None.

    torchrun (and ``torch.distributed.run``) set RANK and WORLD_SIZE; under ``srun`` without
    torchrun, SLURM_PROCID and SLURM_NTASKS are read."""
    env = os.environ if environ is None else environ
    try:
        if "RANK" in env and "WORLD_SIZE" in env:
            rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env and "SLURM_STEP_ID" in env:
            rank, world = int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"])
        else:
            return None
    except ValueError:
        return None
    if world <= 1 or not 0 <= rank < world:
        return None
    store = None
    if env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true" and env.get("MASTER_ADDR") \
            and env.get("MASTER_PORT", "").isdigit():
        store = (env["MASTER_ADDR"], int(env["MASTER_PORT"]))
    prefix = (f"graddoctor/{env.get('TORCHELASTIC_RUN_ID', 'run')}/"
              f"{env.get('TORCHELASTIC_RESTART_COUNT', '0')}")
    return RankEnv(rank, world, store, prefix, run_identity(env))


def run_identity(env) -> str | None:
    """The launcher's name for this run, the same on every rank and another for each run:
    ``GRADDOCTOR_RUN_ID`` when set, torchrun's run id (with ``--rdzv-id`` or ``--standalone``;
    plus its restart count), SLURM's job and step, Open MPI's or PMIx's job; else None."""
    if env.get("GRADDOCTOR_RUN_ID"):
        return env["GRADDOCTOR_RUN_ID"]
    run = env.get("TORCHELASTIC_RUN_ID")
    if run and run != "none":  # "none": torchrun's default --rdzv-id, the same for every run
        return f"torchrun:{run}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    if env.get("SLURM_JOB_ID"):
        return f"slurm:{env['SLURM_JOB_ID']}.{env.get('SLURM_STEP_ID', '')}"
    for key in ("OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"):
        if env.get(key):
            return f"mpi:{env[key]}"
    return None


def rank_path(path: str | None, rank: int) -> str | None:
    """``r{rank}.json`` -> ``r1.json``; ``r.json`` -> ``r.rank1.json`` (the automatic suffix)."""
    if not path:
        return path
    if "{rank}" in path:
        return path.replace("{rank}", str(rank))
    root, ext = os.path.splitext(path)
    return f"{root}.rank{rank}{ext}"


def settled_at_budget(report):
    """A rank that reached the step budget and then failed in a send, recv or collective did
    not crash: a peer stopped at the same budget (a pipeline stage stops at its next backward
    while the stage before it waits for that backward's gradient). It ended at the budget as
    the others did: ``step-limit``, with a note; any other report is returned as it is."""
    run = report.run
    if run.status is not RunStatus.CRASHED or not run.step_budget or run.steps < run.step_budget \
            or not communication_error(run.error):
        return report
    note = (f"this rank's send, recv or collective failed ({run.error.get('type', 'error')}: "
            f"the peer closed the connection) after the step budget of {run.step_budget} steps: "
            f"a peer had stopped at the same budget, so this is the end of the run, not a crash")
    return replace(report, run=replace(run, status=RunStatus.STEP_LIMIT, error=None,
                                       notes=[*run.notes, note]))


LIST_LIMIT = 16  # items of a list in a finding's evidence a rank hands on


def bounded(report):
    """A rank's report of a size that does not grow with the model: the lists in its findings'
    evidence (parameter names) cut to ``LIST_LIMIT`` items and a count of the rest, so that
    1,000 ranks of a model with thousands of tensors pass a few MB, not GB, to rank 0."""
    def cut(value):
        if isinstance(value, list) and len(value) > LIST_LIMIT:
            return [*value[:LIST_LIMIT], f"… and {len(value) - LIST_LIMIT} more"]
        if isinstance(value, dict):
            return {k: cut(v) for k, v in value.items()}
        return value

    findings = [replace(f, evidence=cut(f.evidence)) if f.evidence else f
                for f in report.findings]
    return replace(report, findings=findings)


def rank_report(report, env: RankEnv):
    """This rank's own report as one part of the run: what it hands to rank 0, or writes as
    its own file (``-o 'report.{rank}.json'``)."""
    report = bounded(settled_at_budget(report))
    report = replace(report, run=replace(report.run, run_id=env.run_id))
    return single(report, env.rank, env.label, os.getpid(), env.world_size)


class Terminated(BaseException):
    """SIGTERM while a rank's script runs: the launcher or a scheduler ends the run. Raised
    into the script (a BaseException, as KeyboardInterrupt, so that ``except Exception`` does
    not swallow it), so the rank reports what it has seen, as a crash, and rank 0 merges it."""


@contextlib.contextmanager
def reporting_on_sigterm():
    """While a rank's script runs: SIGTERM ends the script with ``Terminated`` (the rank's
    report follows as for any crash) instead of killing the process without a report. A script
    that installs its own SIGTERM handler keeps it."""
    def on_term(signum, frame):
        raise Terminated("the launcher or a scheduler sent SIGTERM: the run was ended from "
                         "outside (a cancelled job, or another rank failed)")

    try:
        old = signal.signal(signal.SIGTERM, on_term)
    except (ValueError, OSError):  # not the main thread
        yield
        return
    try:
        yield
    finally:
        try:
            if signal.getsignal(signal.SIGTERM) is on_term:
                signal.signal(signal.SIGTERM, old)
        except (ValueError, OSError):
            pass


def describe_exit(code: int | None) -> str:
    """How a process ended, to follow "the rank": ``exited with code 3``, ``was killed by
    SIGKILL (...)``."""
    if code is None:
        return "ended (its exit status is gone)"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        why = {"SIGKILL": " (killed from outside: the out-of-memory killer, a scheduler or a "
                          "user)",
               "SIGTERM": " (stopped from outside: the launcher or a scheduler)",
               "SIGSEGV": " (a crash in native code)", "SIGABRT": " (a crash in native code)"}
        return f"was killed by {name}{why.get(name, '')}"
    if code == 0:
        return "exited with code 0 (the script ended the process itself, e.g. os._exit)"
    return f"exited with code {code}"


def _wait_status(status: int) -> int:
    """A waitpid status as Popen's returncode: the exit code, or minus the signal."""
    return -(status & 0x7F) if status & 0x7F else (status >> 8) & 0xFF


def process_state(pid: int, started: str | None = None) -> tuple[bool, int | None]:
    """(gone, its exit code when the kernel still holds it) of a process on this host, read
    from ``/proc``; ``started``: its start time as registered (a reused pid is not it)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return True, None
    except (OSError, IndexError):
        return False, None  # cannot tell: alive
    if started is not None and len(fields) > 19 and fields[19] != started:
        return True, None  # the pid is another process's now
    if fields[0] in ("Z", "X"):  # ended, not yet reaped by its launcher: the status is there
        try:
            return True, _wait_status(int(fields[49]))
        except (IndexError, ValueError):
            return True, None
    return False, None


def _own_start_time() -> str | None:
    try:
        with open(f"/proc/{os.getpid()}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


TEARDOWN_GRACE_S = 30.0  # a rank's teardown after its report is handed over


def teardown_grace() -> float:
    """How long a rank's teardown may take once its report is handed over
    (``GRADDOCTOR_TEARDOWN_GRACE_S``)."""
    try:
        return float(os.environ.get("GRADDOCTOR_TEARDOWN_GRACE_S") or TEARDOWN_GRACE_S)
    except ValueError:
        return TEARDOWN_GRACE_S


LIVENESS_S = 1.0  # how often rank 0 looks for ranks that are gone while it waits
TERM_WAIT_S = 10.0  # after SIGTERM (torchrun gives its ranks 30 s before SIGKILL)
BATCH = 256  # reports read per store request


class Exchange:
    """The reports of the ranks, through the launcher's store.

    Store traffic does not grow with the time rank 0 waits times the ranks: a rank that sends
    its report sets it and appends its number to the ``done`` log (a counter and one key per
    entry); rank 0 polls the counter (one request) and reads what is new in batches. Ranks
    register ``rank host pid`` in the ``alive`` log when they start, and the launcher of
    ``--nproc-per-node`` appends ``rank exitcode`` to the ``exit`` log when a rank ends with a
    failure: rank 0 tells a dead rank (its process gone on this host, or its exit posted)
    from a slow one within ``LIVENESS_S``."""

    def __init__(self, env: RankEnv, started: float | None = None):
        self.env = env
        self._store = None
        self.error: str | None = None
        self.started = time.time() if started is None else started  # stale files: older
        self._seen = {"done": 0, "alive": 0, "exit": 0}
        self.where: dict[int, tuple[str, int, str | None]] = {}  # rank -> (host, pid, start)
        self.exits: dict[int, int] = {}  # rank -> exit code, as the launcher saw it
        self.requests = 0  # store requests made by collect (the benchmark reads it)
        self.script: tuple[str, list[str]] | None = None  # (script, argv) of this run

    def connect(self):
        if self._store is None:
            from datetime import timedelta

            import torch.distributed as dist

            host, port = self.env.store
            self._store = dist.TCPStore(host, port, is_master=False, wait_for_workers=False,
                                        timeout=timedelta(seconds=STORE_TIMEOUT_S))
        return self._store

    def report_key(self, rank: int) -> str:
        return f"{self.env.prefix}/report/{rank}"

    def append_log(self, log: str, value: str) -> None:
        store = self.connect()
        n = store.add(f"{self.env.prefix}/{log}/n", 1)
        store.set(f"{self.env.prefix}/{log}/{n}", value)

    def read_log(self, store, log: str) -> list[str]:
        """The entries appended to ``log`` since the last read (one request when none)."""
        n = store.add(f"{self.env.prefix}/{log}/n", 0)
        self.requests += 1
        first = self._seen[log] + 1
        if n < first:
            return []
        keys = [f"{self.env.prefix}/{log}/{k}" for k in range(first, n + 1)]
        out = []
        for i in range(0, len(keys), BATCH):
            out += [v.decode("utf-8") for v in store.multi_get(keys[i:i + BATCH])]
            self.requests += 1
        self._seen[log] = n
        return out

    def register(self) -> None:
        """At a rank's start: where it runs, for rank 0 to see it gone."""
        if self.env.store is None:
            return
        try:
            self.append_log("alive", f"{self.env.rank} {socket.gethostname()} {os.getpid()} "
                                  f"{_own_start_time() or '-'}")
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"

    def post_exit(self, rank: int, code: int) -> None:
        """From the launcher: a rank ended with ``code``."""
        self.append_log("exit", f"{rank} {code}")

    def post_verdict(self, code: int) -> None:
        """Rank 0, once the run's report is written: its exit code, for the launcher."""
        if self.env.store is not None:
            try:
                self.connect().set(f"{self.env.prefix}/verdict", str(code))
            except Exception:
                pass

    def read_verdict(self) -> int | None:
        store = self.connect()
        key = f"{self.env.prefix}/verdict"
        return int(store.get(key)) if store.check([key]) else None

    def send(self, text: str) -> bool:
        if self.env.store is None:
            self.error = "no launcher store (not started by torchrun)"
            return False
        try:
            self.connect().set(self.report_key(self.env.rank), text)
            self.append_log("done", str(self.env.rank))
            return True
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            return False

    def foreign(self, rank: int, report, mtime: float | None = None) -> str | None:
        """Why ``report``, read as rank ``rank``'s, is not this run's (None: it is)."""
        run, env = report.run, self.env
        entries = run.ranks or []
        if len(entries) != 1 or entries[0].get("rank") != rank:
            return "it is not this rank's own report"
        if env.run_id and run.run_id and run.run_id != env.run_id:
            return f"it is from another run ({run.run_id})"
        if run.world_size != env.world_size:
            return f"it is from a run of {run.world_size} ranks"
        if self.script is not None and (run.script, list(run.argv)) != self.script:
            return f"it is a report of another command ({' '.join([run.script, *run.argv])})"
        if mtime is not None and mtime < self.started - 5.0:
            return "it was written before this run started"
        return None

    def _liveness(self, store, pending: list[int]) -> dict[int, str]:
        """The pending ranks known to be gone, and how they ended."""
        for entry in self.read_log(store, "alive"):
            rank, host, pid, start = entry.split()
            self.where[int(rank)] = (host, int(pid), None if start == "-" else start)
        for entry in self.read_log(store, "exit"):
            rank, code = entry.split()
            self.exits[int(rank)] = int(code)
        here = socket.gethostname()
        dead = {}
        for r in pending:
            if r in self.exits:
                dead[r] = describe_exit(self.exits[r])
            elif r in self.where and self.where[r][0] == here:
                gone, code = process_state(self.where[r][1], self.where[r][2])
                if gone:
                    dead[r] = describe_exit(code)
        return dead

    def collect(self, wait_s: float, files: dict[int, str] | None = None
                ) -> tuple[dict[int, object], dict[int, str]]:
        """Rank 0: the other ranks' reports (read back as ``Report``) as they arrive, until all
        are in, every rank left is gone, or ``wait_s`` has passed (or SIGTERM: the launcher is
        ending the run). ``files``: per-rank report files to read when there is no store (a
        shared file system). Returns (reports, why each missing one is missing)."""
        others = [r for r in range(self.env.world_size) if r != self.env.rank]
        store = None
        if self.env.store is not None:
            try:
                store = self.connect()
            except Exception as exc:
                self.error = f"{type(exc).__name__}: {exc}"
        if store is None and not files:
            return {}, {r: f"no report: {self.error or 'no launcher store'}; write per-rank "
                           f"reports with -o 'report.{{rank}}.json' and join them with "
                           f"`graddoctor merge`" for r in others}
        inbox = _Inbox(self, others, store, files)
        dead, terminated = self._wait(inbox, wait_s)
        got, why = inbox.got, inbox.why
        if terminated:
            failed = sorted(r for r in dead if r in why)
            cause = f" after rank {spans(failed)} {dead[failed[0]]}" if failed else ""
            for r in others:
                if r not in got and r not in why:
                    why[r] = f"no report: the launcher ended the run{cause} before this rank reported"
        for r in others:
            if r not in got and r not in why:
                why[r] = (f"no report of this run ({inbox.stale[r]})" if r in inbox.stale else
                          f"no report within {wait_s:.0f} s: the rank is still running (stuck) "
                          f"or ended without the launcher or this host seeing it")
        return got, why

    def _wait(self, inbox: "_Inbox", wait_s: float) -> tuple[dict[int, str], bool]:
        """Read what arrives until every other rank is in or accounted for, or the deadline;
        returns (the ranks seen gone and how, whether SIGTERM came)."""
        deadline = time.monotonic() + wait_s
        terminated = []

        def on_term(signum, frame):
            # the launcher ends the run (a rank failed, or the job was cancelled): the other
            # ranks get the signal too and report what they had; wait a little for that
            terminated.append(True)
            nonlocal deadline
            deadline = min(deadline, time.monotonic() + TERM_WAIT_S)

        old = None
        try:
            old = signal.signal(signal.SIGTERM, on_term)
        except (ValueError, OSError):  # not the main thread
            pass
        next_look = time.monotonic() + LIVENESS_S
        dead: dict[int, str] = {}
        got, why = inbox.got, inbox.why
        try:
            while True:
                inbox.arrived()
                pending = [r for r in inbox.others if r not in got and r not in why]
                if not pending or time.monotonic() > deadline:
                    break
                if inbox.store is not None and time.monotonic() >= next_look:
                    dead.update(self._liveness(inbox.store, pending))
                    if dead:
                        inbox.arrived()  # a report sent just before the process ended
                        for r, how in dead.items():
                            if r not in got and r not in why:
                                why[r] = f"no report: the rank {how} before it reported"
                    next_look = time.monotonic() + LIVENESS_S
                    continue
                time.sleep(POLL_S)
        except Exception as exc:
            why.update({r: f"no report: {type(exc).__name__}: {exc}" for r in inbox.others
                        if r not in got and r not in why})
        finally:
            if old is not None:
                try:
                    signal.signal(signal.SIGTERM, old)
                except (ValueError, OSError):
                    pass
        return dead, bool(terminated)


class _Inbox:
    """What rank 0 has received while it collects: the reports of this run (``got``), why a
    rank has none (``why``), reports found that are another run's (``stale``)."""

    def __init__(self, exchange: Exchange, others: list[int], store, files):
        self.exchange = exchange
        self.others = others
        self.store = store
        self.files = files
        self.got: dict[int, object] = {}
        self.why: dict[int, str] = {}
        self.stale: dict[int, str] = {}

    def take(self, r: int, text: str, mtime: float | None = None) -> None:
        try:
            report = from_dict(json.loads(text))
        except Exception as exc:
            self.why[r] = f"unreadable report: {type(exc).__name__}: {exc}"
            return
        reason = self.exchange.foreign(r, report, mtime)
        if reason is None:
            self.got[r] = report
            self.stale.pop(r, None)
        else:
            self.stale[r] = reason

    def arrived(self) -> None:
        """Read the reports that came in since the last look."""
        exchange, store = self.exchange, self.store
        if store is not None:
            ranks = [int(r) for r in exchange.read_log(store, "done")]
            ranks = [r for r in ranks if r in self.others and r not in self.got]
            for i in range(0, len(ranks), BATCH):
                batch = ranks[i:i + BATCH]
                texts = store.multi_get([exchange.report_key(r) for r in batch])
                exchange.requests += 1
                for r, text in zip(batch, texts):
                    self.take(r, text.decode("utf-8"))
            return
        for r in self.others:
            if r in self.got or r in self.why:
                continue
            try:
                mtime = os.stat(self.files[r]).st_mtime
                with open(self.files[r], encoding="utf-8") as f:
                    self.take(r, f.read(), mtime)
            except FileNotFoundError:
                pass
            except (OSError, UnicodeDecodeError):
                pass  # being written: read again


def gather(exchange: "Exchange", report, options, wait_s: float | None = None,
           files: dict[int, str] | None = None):
    """Rank 0: the run's one report, its own and every other rank's merged once (a rank whose
    report did not arrive is ``missing``), with the verdict's options in it."""
    env = exchange.env
    if wait_s is None:
        wait_s = (options.timeout or 3600.0) + 60.0
    if (report.run.error or {}).get("type") == "Terminated":  # the others end now too
        wait_s = min(wait_s, TERM_WAIT_S)
    exchange.script = (report.run.script, list(report.run.argv))
    got, why = exchange.collect(wait_s, files)
    own = settled_at_budget(report)
    own = replace(own, run=replace(own.run, run_id=env.run_id))
    parts = [Part(own, env.rank, env.label, os.getpid())]
    parts += [Part(r, rank, f"rank {rank}") for rank, r in sorted(got.items())]
    missing = [missing_entry(r, f"rank {r}", message) for r, message in sorted(why.items())]
    return merge(parts, world_size=env.world_size, missing=missing, fail_on=options.fail_on,
                 allow_incomplete=options.allow_incomplete,
                 rules=selected_rules(options.select, options.ignore))


def _launcher_patches(context_cls, patches) -> dict:
    """Patches of torchrun's process context, for ``--nproc-per-node``, made through
    ``patches`` (instrument/patcher.py ``Patcher``, undone by the caller):

    * before it stops the ranks still running (one rank failed, or the launcher got a signal)
      it posts the exit codes of the ranks that ended with a failure to the ``exit`` log of
      the run's store, so that rank 0 knows a dead rank and how it died within a second;
    * a rank other than 0 that ends with a failure after it handed over its report (ended
      by graddoctor's teardown timer, stuck in a destructor) is not a failure of the run: its
      report counts, and the other ranks are not stopped for it.

    * rank 0's exit code is the merged verdict it posted (``verdict``), also when its own
      teardown then hung and graddoctor's timer ended it; once rank 0 has ended, the ranks
      still running are ended after ``teardown_grace()``.

    Returns the state they share (``verdict``: rank 0's exit code as it posted it)."""
    posted: set[tuple] = set()
    state: dict = {}  # "verdict": rank 0's exit code as it posted it
    reported: dict[str, set[int]] = {}  # prefix -> ranks in its done log
    readers: dict[str, "Exchange"] = {}

    def has_reported(env) -> bool:
        if env.rank not in reported.setdefault(env.prefix, set()):
            reader = readers.setdefault(env.prefix, Exchange(env))
            store = reader.connect()
            reported[env.prefix].update(int(r) for r in reader.read_log(store, "done"))
        return env.rank in reported[env.prefix]

    original_close = context_cls.close
    original_capture = context_cls._capture_process_failures

    def close(context, *args, **kwargs):
        try:
            for local_rank, handler in getattr(context, "subprocess_handlers", {}).items():
                code = handler.proc.poll()
                if code is None or code == 0:  # running, or ended after its report
                    continue
                env = rank_env(context.envs[local_rank])
                if env is None or env.store is None or (env.prefix, env.rank) in posted:
                    continue
                posted.add((env.prefix, env.rank))
                Exchange(env).post_exit(env.rank, code)
        except Exception:
            pass  # graddoctor's own failure: rank 0 falls back on /proc and its wait
        return original_close(context, *args, **kwargs)

    def capture(context, done_local_ranks):
        original_capture(context, done_local_ranks)
        try:
            envs = {lr: rank_env(context.envs[lr]) for lr in context.subprocess_handlers}
            zero = next((lr for lr, e in envs.items() if e is not None and e.rank == 0), None)
            zero_done = zero is not None and \
                context.subprocess_handlers[zero].proc.returncode is not None
            for local_rank in list(context._failures):
                env = envs.get(local_rank)
                if env is None or env.store is None:
                    continue
                if env.rank == 0:
                    reader = readers.setdefault(env.prefix, Exchange(env))
                    verdict = reader.read_verdict()
                    if verdict is not None:  # rank 0 wrote the report: its code is the verdict
                        state["verdict"] = verdict
                        del context._failures[local_rank]
                elif zero_done or has_reported(env):
                    del context._failures[local_rank]
            if zero_done and "verdict" in state:
                # the report is written: a rank still running is stuck in its teardown, or
                # is missing from the report already; it is not waited for
                ended = state.setdefault("zero_ended", time.monotonic())
                if time.monotonic() - ended > teardown_grace():
                    for lr in list(getattr(context, "_running_local_ranks", ())):
                        context.subprocess_handlers[lr].proc.kill()
        except Exception:
            pass

    patches.patch(context_cls, "close", close)
    patches.patch(context_cls, "_capture_process_failures", capture)
    return state


def launch(nproc: int, child_args: list[str]) -> int:
    """``graddoctor check --nproc-per-node N ...``: start N ranks of ``python -m graddoctor
    check ...`` through ``torch.distributed.run`` (the library behind torchrun; a single node,
    a free port) and return rank 0's exit code (the merged verdict)."""
    import logging
    import sys

    from torch.distributed.elastic.multiprocessing.api import SubprocessContext
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    args = get_args_parser().parse_args(
        ["--standalone", f"--nproc-per-node={nproc}", "--module", "graddoctor", "check",
         *child_args])
    quiet = []  # torchrun's own log lines (closing signals, a rank's exit 1 read as a failure)
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if name.startswith("torch.distributed") and isinstance(logger, logging.Logger):
            quiet.append((logger, logger.level))
            logger.setLevel(logging.CRITICAL)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default, without its warning
    from ..instrument.patcher import Patcher  # (torch: imported above already)

    patches = Patcher()
    state = _launcher_patches(SubprocessContext, patches)
    try:
        run(args)
        return state.get("verdict", 0)
    except SignalException as exc:
        # a CI job cancelled: the agent has passed the signal to the ranks and waited for them;
        # rank 0 wrote the merged report of what every rank had. Incomplete, not "findings"
        sig = getattr(exc, "sigval", None)
        name = getattr(sig, "name", None) or "a signal"
        print(f"graddoctor: error: the run was stopped ({name} to the launcher): the report "
              f"holds what each rank had seen", file=sys.stderr)
        return 2
    except ChildFailedError as exc:
        failures = exc.failures
        codes = {rank: f.exitcode for rank, f in failures.items()}
        if "verdict" in state:
            return state["verdict"]
        if 0 not in codes or codes[0] in (1, 2):
            # rank 0 exits only after it has every rank's report or has marked the rank
            # missing in the merge: its code is the merged verdict (0 when rank 0 is not among
            # the failures), whatever a rank that ended after its report (stuck in teardown,
            # stopped by the launcher) did
            return codes.get(0, 0)
        died = ", ".join(f"rank {r} {describe_exit(c)}" for r, c in sorted(codes.items()))
        print(f"graddoctor: error: rank 0 ended before it wrote the run's report: {died}",
              file=sys.stderr)
        return 2
    finally:
        patches.undo()
        for logger, level in quiet:
            logger.setLevel(level)
