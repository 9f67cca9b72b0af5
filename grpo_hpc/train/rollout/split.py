"""``rollout.placement=split``: the trainers' side of generator processes of their own
(docs/async.md). The generator's side is :mod:`grpo_hpc.train.generator`; which generator
serves which trainer (trainer ``r``: generator ``r % G``) is :mod:`grpo_hpc.config.roles`'s.

The schedule is the thread placement's (:mod:`schedule`), carried out over the process
group instead of a thread: at step ``t`` each trainer names the steps the plan generates
(the step's own batch when it is missing, then ``t+1 .. t+k``; the plan is the same on
every trainer), draws its share of their prompts from its own sampler (the data order
stays the trainers', in their checkpoint), and sends them with the seed in use and the
rollout cap to its generator; then trainer 0 broadcasts the weights, version ``t``, in the
group {trainer 0, every generator}. Each generator loads them, generates each named batch
for each of its trainers with the thread's code and that trainer's random stream
(``making.generate``) and sends it back as a :class:`Collected`, the sampler's log-probs
included. No generator starts a step the trainers did not name, and no batch depends on
which generator made it, so the run stays a function of its seed:
on a CPU it trains bit for bit what the thread placement trains
(tests/e2e/test_async_split.py).

Partial rollouts (``rollout.partial_pool``): the trainer keeps the pool. It tops it up from
its own sampler and sends it with each request (one round a request); its generator runs
the round with the thread's code and sends the batch back with the pool as the round left
it (tests/e2e/test_async_partial.py: bit for bit the thread placement's rounds).

Messages are pickled values sent as byte tensors point to point over the default group
(gloo on a CPU); the weights travel a tensor at a time, broadcast (under FSDP2 each
gathered by the trainers first; on NCCL the same code moves the GPU tensors, no host copy;
not yet run on a GPU). While a trainer waits for its generator a thread beats its
heartbeat, so that a long first batch does not read as a hung trainer.
"""

from __future__ import annotations

import contextlib
import io
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as tdist

from grpo_hpc.config import roles
from grpo_hpc.config.roles import GENERATOR, Role
from grpo_hpc.config.schema import Config
from grpo_hpc.train.distributed.gather import gather_into, is_shard, unique_state
from grpo_hpc.train.rollout.collect import Collected, Collector
from grpo_hpc.train.rollout.making import Entry
from grpo_hpc.train.rollout.pipeline import RolloutPipeline
from grpo_hpc.train.rollout.schedule import Made, plan
from grpo_hpc.train.rollout.types import EngineOptions

WaitingOn = Callable[[int, str], contextlib.AbstractContextManager[None]]
"""Marks, while its body runs, that this process waits on a global rank for something
(``Liveness.waiting_on``)."""

TICK_S = 1.0
"""Seconds between the trainer's heartbeats while it waits for the generator."""


class GeneratorGone(RuntimeError):
    """A generator ended before sending a batch it was asked for, or sent another."""


@dataclass(frozen=True)
class Link:
    """This process's end of a split run's process group."""

    role: Role
    """What this process does."""
    peers: tuple[int, ...]
    """The global ranks it exchanges messages with (``Role.peers``): a trainer, its
    generator's; a generator, its trainers', in the order it serves them (the first sends
    its stop; the hello comes from trainer 0)."""
    sync_group: Any
    """The group {trainer 0, every generator} the weights are broadcast in."""
    trainer_group: Any
    """The trainers' own group (their DDP, their agreements), generators left out."""
    device: torch.device
    """Where this process computes (the weights travel from and to it)."""
    waiting_on: WaitingOn | None = None
    """This process's pulse's ``Liveness.waiting_on`` (None: ``dist.peer_timeout_s=0``): a
    trainer marks in it what it waits on, for its watch on the generator's progress
    (``rollout.progress_timeout_s``)."""

    @property
    def peer(self) -> int:
        """A trainer: its generator's global rank; a generator: its first trainer's."""
        return self.peers[0]


def connect(
    cfg: Config, role: Role, device: torch.device, waiting_on: WaitingOn | None = None
) -> Link:
    """Join the split run's groups (every rank calls this, in the same order: process
    groups are created collectively); ``waiting_on``: :attr:`Link.waiting_on`."""
    t, world = role.trainers, tdist.get_world_size()
    sync = tdist.new_group(ranks=[0, *range(t, world)])  # trainer 0: the broadcast's source
    trainers = tdist.new_group(ranks=list(range(t)))
    return Link(role, role.peers, sync, trainers, device, waiting_on)


@dataclass(frozen=True)
class Hello:
    """What trainer 0 tells every generator once, before the first step: everything it
    needs to build the same engine on the same model as the thread placement's shadow."""

    cfg: Config
    """The trainer's resolved config (``auto`` settings decided, the system prompt set)."""
    options: EngineOptions
    """The trainer's engine options (the longest prompt of its data included)."""
    load_dtype: torch.dtype
    """The dtype the trainer loaded the model in."""
    names: tuple[str, ...]
    """The policy's state-dict keys, in the order the weights travel."""

    @classmethod
    def of(
        cls, cfg: Config, options: EngineOptions, load_dtype: torch.dtype,
        policy: torch.nn.Module,
    ) -> Hello:  # fmt: skip
        return cls(cfg, options, load_dtype, tuple(policy.state_dict()))


@dataclass(frozen=True)
class Job:
    """One batch a generator is to make for one trainer."""

    made: Made
    """Its step, version (the weights sent with the request) and lineage."""
    problems: list[dict]
    """The trainer's share of the step's prompts, as its sampler drew them; with a
    ``pool``, each of its flights' problem, in the pool's order."""
    draw: int
    """Where in the data order they were drawn from (``rollout.seed_per_group``)."""
    pool: dict[str, Any] | None = None
    """Partial rollouts (``rollout.partial_pool``): the trainer's pool of answers in flight,
    topped up for this round (``PartialPool.state_dict``). The trainer keeps the pool (in
    its checkpoint, as the thread placement does); the generator advances it by one round
    and sends it back with the batch (``Entry.pool``), holding nothing between requests."""


@dataclass(frozen=True)
class Request:
    """A trainer's order for one step to its generator (every trainer sends one, for its
    own share; the weights follow them from trainer 0), or a generator's first trainer's
    ``stop``."""

    jobs: tuple[Job, ...] = ()
    """The batches to make, in order: the step's own first when it is missing."""
    seed: int = 0
    """The sampling seed in use (a rollback may have changed it)."""
    cap: int = 0
    """The rollout cap in force (a rollback may have raised it)."""
    stop: bool = False
    """The trainers are done: the generator exits."""
    weights: bool = True
    """Trainer 0 broadcasts the weights after the requests. False: the generator keeps the
    weights it has (partial rollouts ask for the step's own round and, once it is back,
    the next one, both of the same weights)."""


# ---------------------------------------------------------------------- transport
def send_obj(obj: Any, dst: int, device: torch.device) -> None:
    """``obj`` pickled to global rank ``dst``; ``device``: this process's (the bytes travel
    from there under NCCL, which moves no host tensor; from the host under gloo)."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    wire = _wire(device)
    payload = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8).to(wire)
    size = torch.tensor([payload.numel()], dtype=torch.int64, device=wire)
    for t in (size, payload):
        _finish(tdist.isend(t, dst))


def recv_obj(src: int, device: torch.device, tick: Callable[[], None] | None = None) -> Any:
    """The next object from global rank ``src``, its tensors on ``device`` (this
    process's: the sender's GPU index is not ours); ``tick`` is called while waiting (the
    trainer's heartbeat)."""
    wire = _wire(device)
    size = torch.zeros(1, dtype=torch.int64, device=wire)
    _wait(tdist.irecv(size, src), tick)
    payload = torch.empty(int(size.item()), dtype=torch.uint8, device=wire)
    _wait(tdist.irecv(payload, src), tick)
    data = io.BytesIO(payload.cpu().numpy().tobytes())
    return torch.load(data, map_location=device, weights_only=False)


def _wire(device: torch.device) -> torch.device:
    """Where a message's bytes travel from: the device under NCCL, the host under gloo."""
    return device if "nccl" in str(tdist.get_backend()) else torch.device("cpu")


def _wait(work: Any, tick: Callable[[], None] | None = None) -> None:
    """Wait for ``work``, calling ``tick`` every ``TICK_S`` meanwhile (gloo's point-to-point
    work completes only inside ``wait``: it cannot be polled)."""
    with beating(tick):
        _finish(work)


@contextlib.contextmanager
def beating(tick: Callable[[], None] | None) -> Iterator[None]:
    """Call ``tick`` every ``TICK_S`` from a thread while the body blocks (None: no
    thread). A trainer waiting on a generator beats its heartbeat so that the monitor does
    not call it stalled: a generator that stops answering is its peers' watch to catch and
    name (``dist.peer_timeout_s``: its pulses stop), not a heartbeat limit's."""
    if tick is None:
        yield
        return
    done = threading.Event()

    def beat() -> None:
        while not done.wait(TICK_S):
            tick()

    beater = threading.Thread(target=beat, name="grpo-split-wait", daemon=True)
    beater.start()
    try:
        yield
    finally:
        done.set()
        beater.join()


def _finish(work: Any) -> None:
    """``work`` done, its data readable: under NCCL ``wait`` only orders the stream, so the
    host waits for the device too."""
    work.wait()
    if "nccl" in str(tdist.get_backend()):
        torch.cuda.synchronize()


def broadcast_weights(model: torch.nn.Module, link: Link) -> None:
    """Trainer 0's full weights into every generator's ``model`` (same keys, same order),
    a tensor at a time; every trainer and generator calls it. Under FSDP2 the trainers
    first gather each tensor in their own group (:mod:`gather`; the other trainers take
    part in the gather only), then trainer 0 broadcasts it in the sync group; the
    generators receive it in place. Peak beyond the model: one full tensor on each trainer
    under FSDP2 (none without: trainer 0 sends its own tensors), none on a generator.
    Every value arrives bit for bit."""
    src = 0  # trainer 0
    generator = link.role.name == GENERATOR
    first = not generator and link.role.index == 0
    for _, t in unique_state(model):
        t = t.detach()
        if generator:
            into = t if t.is_contiguous() else t.contiguous()  # received in place
            tdist.broadcast(into, src=src, group=link.sync_group)
            if into is not t:
                t.copy_(into)
            continue
        if is_shard(t):  # a collective of the trainers: each trainer gathers
            full = torch.empty(t.shape, dtype=t.dtype, device=link.device)
            gather_into(full, t)
        elif not first:
            continue  # nothing to gather, nothing to send
        else:
            full = t.contiguous()
        if first:
            tdist.broadcast(full, src=src, group=link.sync_group)


# ---------------------------------------------------------------------- trainer side
@dataclass
class Outstanding:
    """Batches requested from the generator and not received yet."""

    made: list[Made] = field(default_factory=list)
    """In the order the generator sends them."""


class SplitPipeline(RolloutPipeline):
    """A trainer's rollouts from its generator process: the thread placement's
    :class:`RolloutPipeline` (its pending batches, checkpoints and metrics), with the
    shadow and the thread replaced by messages to the generator."""

    def __init__(
        self, collector: Collector, policy: torch.nn.Module, link: Link, hello: Hello,
        tick: Callable[[], None],
    ) -> None:  # fmt: skip
        """``policy``: the unwrapped model whose weights are sent; ``hello``: what every
        generator builds its engine from (sent now by trainer 0: they load while the
        trainers resume); ``tick``: the trainer's heartbeat, beaten while it waits."""
        cfg = collector.cfg
        self.collector, self.k = collector, cfg.algo.max_staleness
        self.pending: dict[int, Entry] = {}
        self.thread = None
        self.error = None
        self.last: Made | None = None
        self.last_report = None
        self.pool = None  # partial rollouts: the trainer keeps it, its generator advances it
        self.waited_s = 0.0
        self.sync_s = 0.0
        self.depth = None
        self.policy, self.link, self.tick = policy, link, tick
        self.outstanding = Outstanding()
        self.cap = cfg.rollout.max_new_tokens
        self.first = link.role.index == 0  # trainer 0: the weights, the hello
        self.closed = not link.role.stops_generator
        if self.first:
            for rank in link.role.generator_ranks:
                send_obj(hello, rank, link.device)

    def collect(self, step: int, lineage: int, seed: int) -> Collected:
        """The batch step ``step`` trains; its generator makes the batches the plan names
        (the step's own first, waited for here, when it is missing)."""
        self._start_pool(step)
        self.settle()
        made = [e.made for e in self.pending.values()]
        end = self.collector.cfg.training.max_steps
        decision = plan(step, self.k, lineage, made, end, self.ahead_depth(step))
        for s in decision.drop:
            del self.pending[s]
        steps = ((step,) if decision.now else ()) + decision.ahead
        if self.pool is not None and decision.now and decision.ahead:
            entry = self._now_then_ahead(step, lineage, seed, decision.ahead)
        else:
            if steps:
                self._order(Request(self._jobs(steps, step, lineage), seed, self.cap), step)
            entry = self._receive() if decision.now else self.pending.pop(step)
        self.last, self.last_report = entry.made, entry.report
        return entry.collected

    def _now_then_ahead(self, step: int, lineage: int, seed: int, ahead: tuple[int, ...]) -> Entry:
        """Partial rollouts, the step's own batch missing: a round tops up the pool the
        round before left, so the step's round comes back before the next is asked for
        (of the same weights: sent once)."""
        self._order(Request(self._jobs((step,), step, lineage), seed, self.cap), step)
        entry = self._receive()
        jobs = self._jobs(ahead, step, lineage)
        self._order(Request(jobs, seed, self.cap, weights=False), step)
        return entry

    def _jobs(self, steps: tuple[int, ...], step: int, lineage: int) -> tuple[Job, ...]:
        """The batches of ``steps`` (asked for at ``step``), their prompts drawn in the order
        the thread placement draws them: the step's own, then the batches ahead; with
        partial rollouts, the pool topped up as the thread's round tops it up."""
        jobs = []
        for s in steps:
            made = Made(s, step, lineage)
            if self.pool is None:
                problems, draw = self.collector.draw()
                jobs.append(Job(made, problems, draw))
                continue
            assert len(steps) == 1, "partial rollouts ask for one round at a time"
            self.pool.prepare(self.collector, lineage)
            problems = [self.collector.train_set[f.index] for f in self.pool.flights]
            jobs.append(Job(made, problems, 0, self.pool.state_dict()))
        self.outstanding.made += [j.made for j in jobs]
        return tuple(jobs)

    def _order(self, request: Request, step: int) -> None:
        """Send ``request`` to this trainer's generator, then the weights to every generator
        (trainer 0 sends them; under FSDP2 every trainer takes part in their gather)."""
        what = f"the generators to take step {step + 1}'s request and weights"
        try:  # both wait for the generators (a stopped one: until the peers' watch ends it)
            with beating(self.tick), self._waiting(what):
                send_obj(request, self.link.peer, self.link.device)
                if request.weights:
                    t = time.monotonic()  # every trainer: FSDP2's shards are gathered by all
                    broadcast_weights(self.policy, self.link)
                    self.sync_s += time.monotonic() - t
        except RuntimeError as e:  # gloo: a generator's connection closed
            # no stop then: another generator may wait in this broadcast for weights that
            # will not come, and a stop sent to it would wait with it (until torchrun's kill)
            self.closed = True
            raise GeneratorGone(
                f"a generator ended before the request of step {step + 1}: {e}"
            ) from e

    def settle(self) -> None:
        """Receive the batches its generator was asked for."""
        if not self.outstanding.made:
            return
        t = time.monotonic()
        while self.outstanding.made:
            entry = self._receive()
            self.pending[entry.made.step] = entry
        self.waited_s += time.monotonic() - t

    def _receive(self) -> Entry:
        want = self.outstanding.made.pop(0)
        try:
            with self._waiting(f"step {want.step + 1}'s rollouts"):
                entry = recv_obj(self.link.peer, self.link.device, self.tick)
        except RuntimeError as e:  # gloo: the connection to the generator closed
            self.closed = True  # nothing more to tell it
            raise GeneratorGone(
                f"{self._generator} ended without sending the batch of step {want.step + 1}: {e}"
            ) from e
        # a bug, not a fault: say it rather than train it (a partial round's batch is as
        # stale as its oldest group: its version is the generator's to say)
        if entry.made.step != want.step or entry.made.lineage != want.lineage:
            raise GeneratorGone(f"{self._generator} sent {entry.made}, expected {want}")
        if self.pool is not None:  # the pool as the round left it
            self.pool.load_state_dict(entry.pool)
            entry.pool = None
        elif entry.made != want:
            raise GeneratorGone(f"{self._generator} sent {entry.made}, expected {want}")
        return entry

    def _waiting(self, what: str) -> contextlib.AbstractContextManager[None]:
        """While this trainer blocks on its generator (for ``what``), its pulse thread
        judges the generator's progress: a generator alive but stuck pulses on, and the
        heartbeat this trainer beats meanwhile hides it from the monitor."""
        mark = self.link.waiting_on
        return contextlib.nullcontext() if mark is None else mark(self.link.peer, what)

    @property
    def _generator(self) -> str:
        """This trainer's generator as an error names it (``generator 1 (rank 3)``)."""
        role, rank = self.link.role, self.link.peer
        name = roles.label(GENERATOR, rank - role.first_generator, role.generators)
        return f"{name} (rank {rank})"

    def set_max_new_tokens(self, cap: int) -> None:
        """The policy's engine (the evaluation's) now; the generator's with the next
        request."""
        self.collector.engine.set_max_new_tokens(cap)
        self.cap = cap

    def close(self) -> None:
        """A generator's first trainer: tell it the trainers are done (after the last batch
        was received: the generator waits for this trainer's request then). Once; a
        generator already gone is no error."""
        if self.closed or self.outstanding.made:  # it is mid-batch: torchrun ends it
            return
        self.closed = True
        try:  # the generator waits for a request: a small message it takes at once
            send_obj(Request(stop=True), self.link.peer, self.link.device)
        except RuntimeError:
            pass  # the generator is gone already: nothing to tell
