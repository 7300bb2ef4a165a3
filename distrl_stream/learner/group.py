"""A learner group: N members that train one policy together with torch.distributed (data parallel).

Members are started by torch's elastic agent (``torch.distributed.run``, torchrun), which sets ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` and restarts the whole group from the last checkpoint when a
member dies or joins (:func:`launch_command`). A process started without them is a group of one and makes no
collective call at all.

Every member makes the same sequence of collective calls, whatever its replay shard holds, so the group cannot
deadlock on data:

1. once per loop iteration, :meth:`Group.exchange` (one all-reduce of max): "I could update", "I must stop", and the
   newest version rank 0 published. The group updates when *any* member could, stops when *any* must;
2. once per update, :meth:`Group.average_gradients` (one all-reduce of the flattened gradients of the LoRA and critic
   parameters): a member without a batch takes part with zero weight, and the sum is divided by the number of members
   that had one; every member then applies the same clipped step, so weights stay identical;
3. at each checkpoint (every ``checkpoint_interval_updates``, equal on all members since they update together) and
   on stop, :meth:`Group.gather` of each member's offsets and shard, then :meth:`Group.broadcast` of rank 0's result.

Rank 0 alone writes adapters, publishes weight versions and writes checkpoints (:attr:`Membership.writer`).
"""

from __future__ import annotations

import fcntl
import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import IO, Any, TypeVar

import torch
import torch.distributed as dist

from distrl_stream.errors import LearnerError
from distrl_stream.processes import die_with_parent

T = TypeVar("T")

# The agents' store reads wait this long (torch's default, 60 s, is shorter than a member's final checkpoint on busy
# CPUs: an agent stopping its members would miss a rendezvous round that another agent already started).
RDZV_CONF = {"read_timeout": "300"}

# By default the agents keep one TCP store for every rendezvous round, and members' process groups then read keys a
# previous generation left there (a restarted group hangs or dials dead members); a fresh store per round avoids it.
AGENT_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}

# `learn`'s agent puts its pid in its members' environment (:func:`die_with_agent`). Not a DISTRL_ name: those are
# configuration.
AGENT_PID_ENV = "LEARNER_AGENT_PID"

# A stuck member must not hang the others forever: after this the collective fails and the agent restarts the group.
COLLECTIVE_TIMEOUT = timedelta(minutes=10)


@dataclass(frozen=True, slots=True)
class Membership:
    """This process's place in the group, as the elastic agent set it in the environment."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1  # the members on this host (each CUDA member needs a GPU of its own)

    @classmethod
    def from_env(cls) -> Membership:
        """``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` (torchrun's), or a group of one."""
        return cls(
            int(os.environ.get("RANK", "0")),
            int(os.environ.get("WORLD_SIZE", "1")),
            int(os.environ.get("LOCAL_RANK", "0")),
            int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        )

    @property
    def member_id(self) -> str:
        """The member's id: its rank (names its folder and its Kafka static membership)."""
        return str(self.rank)

    @property
    def writer(self) -> bool:
        """Whether this member writes artifacts, weight versions and checkpoints (rank 0)."""
        return self.rank == 0


class Group:
    """Collective calls of one member (no-ops in a group of one).

    Args:
        membership: this member's rank and the group's size.
        device: this member's device, the CPU or an indexed GPU (``cuda:LOCAL_RANK``, :func:`.device.resolve_device`);
            CUDA members talk over NCCL, CPU members over gloo.
    """

    def __init__(self, membership: Membership, device: torch.device) -> None:
        self.membership = membership
        self.device = device
        self.distributed = membership.world_size > 1
        if device.type == "cuda":
            # NCCL's communicator and every allocation on a bare "cuda" go to the current device: make it this
            # member's own GPU, not GPU 0 for all members of the host.
            torch.cuda.set_device(device)

    def start(self) -> None:
        """Join the process group (the rendezvous address comes from the agent's environment)."""
        if not self.distributed or dist.is_initialized():
            return
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=COLLECTIVE_TIMEOUT)

    def close(self) -> None:
        """Leave the process group."""
        if self.distributed and dist.is_initialized():
            dist.destroy_process_group()

    def _comm_device(self) -> torch.device:
        return self.device if self.device.type == "cuda" else torch.device("cpu")

    def exchange(self, values: Sequence[float]) -> list[float]:
        """Element-wise maximum of ``values`` over the members (one all-reduce)."""
        if not self.distributed:
            return list(values)
        t = torch.tensor(list(values), dtype=torch.float64, device=self._comm_device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    def average_gradients(self, params: Sequence[torch.nn.Parameter], contributed: bool) -> bool:
        """Replace each parameter's gradient by its mean over the members that computed one (in place).

        Args:
            params: the trainable parameters, in the same order on every member.
            contributed: whether this member computed gradients this update (False: zero weight).

        Returns:
            Whether any member computed gradients (else every gradient is None and nothing should step).
        """
        if not self.distributed:
            return contributed
        dev = self._comm_device()
        parts, present = [], []
        for p in params:
            has = contributed and p.grad is not None
            present.append(1.0 if has else 0.0)
            grad = p.grad if has else None
            parts.append((grad if grad is not None else torch.zeros_like(p)).reshape(-1).to(dev, torch.float32))
        # One buffer, one all-reduce: the gradients, which parameters had one, and how many members contributed.
        flat = torch.cat([*parts, torch.tensor([*present, 1.0 if contributed else 0.0], device=dev)])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        contributors = flat[-1].item()
        counts = flat[-1 - len(params) : -1]
        if contributors == 0:
            for p in params:
                p.grad = None
            return False
        offset = 0
        for i, p in enumerate(params):
            n = p.numel()
            if counts[i].item() > 0:
                p.grad = (flat[offset : offset + n] / contributors).view_as(p).to(p.device, p.dtype)
            else:
                p.grad = None
            offset += n
        return True

    def broadcast_parameters(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Copy rank 0's values of ``params`` to every member (identical weights from the first update)."""
        if not self.distributed:
            return
        dev = self._comm_device()
        with torch.no_grad():
            for p in params:
                t = p.detach().to(dev).clone()
                dist.broadcast(t, src=0)
                p.copy_(t.to(p.device, p.dtype))

    def broadcast(self, obj: T) -> T:
        """Rank 0's ``obj`` on every member (picklable)."""
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, device=self._comm_device())
        return box[0]

    def gather(self, obj: Any) -> list[Any]:
        """Every member's ``obj``, in rank order, on every member."""
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.membership.world_size
        dist.all_gather_object(out, obj)
        return out


class MemberLock:
    """An exclusive lock on a member's folder, held for the process's life: one process per member id.

    The kernel releases it when the process dies, even by ``kill -9``, so a restarted member takes it again at once.

    Args:
        folder: the member's folder (checkpoints of rank 0, ingest log).
        what: how to name the member in the error (e.g. ``learner member 0 of run demo``).
    """

    def __init__(self, folder: Path, what: str) -> None:
        self.path = folder / ".lock"
        self.what = what
        self._fh: IO[str] | None = None

    def acquire(self) -> None:
        """Take the lock.

        Raises:
            LearnerError: another live process holds it.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = self.path.open("a+")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            fh.close()
            raise LearnerError(f"{self.what} is already running (pid {holder} holds {self.path})") from None
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        self._fh = fh

    def release(self) -> None:
        """Give the lock up (idempotent)."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def die_with_agent() -> None:
    """Tie this member's life to the agent that started it (:data:`AGENT_PID_ENV`; nothing to do without it: a group
    of one, or a member of a plain torchrun): once the agent is gone, a member would go on training and publishing
    versions with nobody to stop it, holding its lock against the restarted group.

    SIGKILL, not SIGTERM: without the agent the group cannot coordinate a final checkpoint, and nothing needs one (the
    restart resumes from the last checkpoint and re-reads Kafka from its offsets, as after any kill -9), while a member
    still stopping would hold its lock and refuse the restarted agent's member.

    Raises:
        LearnerError: the agent died before the signal was armed (this member's parent is already another process).
    """
    agent = os.environ.get(AGENT_PID_ENV)
    if agent is None:
        return
    die_with_parent(signal.SIGKILL)
    # Checked after arming: an agent that dies later sends the signal, one that died before can only be seen here.
    if os.getppid() != int(agent):
        member = Membership.from_env().member_id
        raise LearnerError(f"learner member {member}: the agent that started it (pid {agent}) is gone; not starting")


def launch_command(
    nproc_per_node: int,
    learn_args: Sequence[str],
    *,
    rdzv_endpoint: str,
    max_restarts: int,
    nnodes: str = "1",
    rdzv_conf: Mapping[str, str] | None = None,
) -> list[str]:
    """The torchrun arguments that start ``nproc_per_node`` learner members on this host (``learn_args`` each):
    ``torch.distributed.run.main(launch_command(...))``, or ``python -m torch.distributed.run`` followed by them.

    Args:
        nproc_per_node: members on this host.
        learn_args: the ``learn`` command's arguments for every member (without the launcher's own options).
        rdzv_endpoint: ``host:port`` of the c10d rendezvous (the first host's; any free port on one host).
        max_restarts: how often the agent restarts the group after a member fails.
        nnodes: hosts, ``N`` or ``MIN:MAX`` (elastic).
        rdzv_conf: rendezvous settings (``--rdzv-conf``), over :data:`RDZV_CONF`.
    """
    conf = {**RDZV_CONF, **(rdzv_conf or {})}
    return [
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={rdzv_endpoint}",
        f"--max-restarts={max_restarts}",
        "--rdzv-conf=" + ",".join(f"{k}={v}" for k, v in conf.items()),
        "-m",
        "distrl_stream.cli",
        "--",  # the members' options are not torchrun's (argparse would take --run for an abbreviated --run-path)
        "learn",
        *learn_args,
    ]
