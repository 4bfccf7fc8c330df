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
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass

from ..report.json_format import from_dict
from ..findings import spans
from ..report.merge import Part, merge, missing_entry, single
from ..rules.engine import selected_rules

STORE_TIMEOUT_S = 30.0  # connecting to the launcher's store
POLL_S = 0.1


@dataclass(frozen=True)
class RankEnv:
    rank: int
    world_size: int
    store: tuple[str, int] | None  # the launcher's agent store (torchrun), or None
    prefix: str  # keys of this run in the store

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
    return RankEnv(rank, world, store, prefix)


def rank_path(path: str | None, rank: int) -> str | None:
    """``r{rank}.json`` -> ``r1.json``; ``r.json`` -> ``r.rank1.json`` (the automatic suffix)."""
    if not path:
        return path
    if "{rank}" in path:
        return path.replace("{rank}", str(rank))
    root, ext = os.path.splitext(path)
    return f"{root}.rank{rank}{ext}"


def rank_report(report, env: RankEnv):
    """This rank's own report as one part of the run: what it hands to rank 0, or writes as
    its own file (``-o 'report.{rank}.json'``)."""
    return single(report, env.rank, env.label, os.getpid(), env.world_size)


class Interrupted(Exception):
    """SIGTERM while rank 0 waits: the launcher is ending the run (another rank died)."""


class Exchange:
    """The reports of the ranks, through the launcher's store."""

    def __init__(self, env: RankEnv):
        self.env = env
        self._store = None
        self.error: str | None = None

    def _connect(self):
        if self._store is None:
            from datetime import timedelta

            import torch.distributed as dist

            host, port = self.env.store
            self._store = dist.TCPStore(host, port, is_master=False, wait_for_workers=False,
                                        timeout=timedelta(seconds=STORE_TIMEOUT_S))
        return self._store

    def _key(self, rank: int) -> str:
        return f"{self.env.prefix}/report/{rank}"

    def send(self, text: str) -> bool:
        if self.env.store is None:
            self.error = "no launcher store (not started by torchrun)"
            return False
        try:
            self._connect().set(self._key(self.env.rank), text)
            return True
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            return False

    def collect(self, wait_s: float, files: dict[int, str] | None = None) -> tuple[dict[int, str], dict[int, str]]:
        """Rank 0: the other ranks' reports as they arrive, until all are in or ``wait_s`` has
        passed (or SIGTERM: the launcher is ending the run). ``files``: per-rank report files
        to read when there is no store (a shared file system). Returns (reports, why missing)."""
        others = [r for r in range(self.env.world_size) if r != self.env.rank]
        got: dict[int, str] = {}
        why: dict[int, str] = {}
        store = None
        if self.env.store is not None:
            try:
                store = self._connect()
            except Exception as exc:
                self.error = f"{type(exc).__name__}: {exc}"
        if store is None and not files:
            return got, {r: f"no report: {self.error or 'no launcher store'}; write per-rank "
                            f"reports with -o 'report.{{rank}}.json' and join them with "
                            f"`graddoctor merge`" for r in others}

        def on_term(signum, frame):
            raise Interrupted()

        old = None
        try:
            old = signal.signal(signal.SIGTERM, on_term)
        except (ValueError, OSError):  # not the main thread
            pass
        deadline = time.monotonic() + wait_s
        try:
            while True:
                for r in others:
                    if r in got:
                        continue
                    if store is not None:
                        key = self._key(r)
                        if store.check([key]):
                            got[r] = store.get(key).decode("utf-8")
                    elif files and os.path.exists(files[r]):
                        try:
                            with open(files[r], encoding="utf-8") as f:
                                got[r] = f.read()
                        except OSError:
                            pass
                if len(got) == len(others) or time.monotonic() > deadline:
                    break
                time.sleep(POLL_S)
        except Interrupted:
            why.update({r: "no report: the launcher ended the run (another rank failed)"
                        for r in others if r not in got})
        except Exception as exc:
            why.update({r: f"no report: {type(exc).__name__}: {exc}" for r in others if r not in got})
        finally:
            if old is not None:
                try:
                    signal.signal(signal.SIGTERM, old)
                except (ValueError, OSError):
                    pass
        for r in others:
            if r not in got and r not in why:
                why[r] = f"no report within {wait_s:.0f} s (the rank hung or was killed)"
        return got, why


def gather(exchange: "Exchange", report, options, wait_s: float | None = None,
           files: dict[int, str] | None = None):
    """Rank 0: the run's one report, its own and every other rank's merged once (a rank whose
    report did not arrive is ``missing``), with the verdict's options in it."""
    env = exchange.env
    if wait_s is None:
        wait_s = (options.timeout or 3600.0) + 60.0
    got, why = exchange.collect(wait_s, files)
    parts = [Part(report, env.rank, env.label, os.getpid())]
    for r, text in sorted(got.items()):
        try:
            parts.append(Part(from_dict(json.loads(text)), r, f"rank {r}"))
        except Exception as exc:
            why[r] = f"unreadable report: {type(exc).__name__}: {exc}"
    missing = [missing_entry(r, f"rank {r}", message) for r, message in sorted(why.items())]
    return merge(parts, world_size=env.world_size, missing=missing, fail_on=options.fail_on,
                 allow_incomplete=options.allow_incomplete,
                 rules=selected_rules(options.select, options.ignore))


def launch(nproc: int, child_args: list[str]) -> int:
    """``graddoctor check --nproc-per-node N ...``: start N ranks of ``python -m graddoctor
    check ...`` through ``torch.distributed.run`` (the library behind torchrun; a single node,
    a free port) and return rank 0's exit code (the merged verdict)."""
    import logging

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
    try:
        run(args)
        return 0
    except ChildFailedError as exc:
        failures = exc.failures
        lead = failures.get(0) or failures.get(min(failures))
        codes = {rank: f.exitcode for rank, f in failures.items()}
        if codes.get(0) in (1, 2):
            # the merged verdict (1: findings, 2: could not check). Rank 0 exits only after it
            # has every rank's report or has marked the rank missing in the merge, so a rank
            # the launcher stopped after that (still tearing down) changes nothing
            return codes[0]
        died = ", ".join(f"rank {r} exit code {c}" for r, c in sorted(codes.items()))
        import sys

        print(f"graddoctor: error: {died}: a rank ended without its report "
              f"(ranks {spans(codes)})", file=sys.stderr)
        return 2 if lead is None or lead.exitcode not in (1, 2) else lead.exitcode
    finally:
        for logger, level in quiet:
            logger.setLevel(level)
