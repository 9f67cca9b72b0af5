"""Which process does what in a run (pure): with ``rollout.placement=split`` torchrun
starts ``T + G`` ranks, the first ``T`` train and the last ``G`` generate; otherwise every
rank trains (and, asynchronous, generates in a thread of its own). docs/async.md.

Trainers first, not generators: global rank 0 is then trainer 0, the rank that libraries
take for the main process. transformers' ``save_pretrained`` writes nothing on a rank
other than 0 of an initialized process group (``should_save_on_this_rank``), so with a
generator at rank 0 the trainer wrote no ``tiny`` model and would write no export.

Trainer ``r`` is served by generator ``r % G`` (:func:`generator_of`): the trainers' shares
dealt round the generators, each generator making the batches of ``T / G`` trainers (one
more for the first ``T % G``), so that a step's rollouts come back about ``G`` times
sooner. ``G <= T``: a generator with no trainer would have nothing to make
(``config.validate.split_problem``)."""

from __future__ import annotations

from dataclasses import dataclass

from grpo_hpc.config.schema import Config

GENERATOR, TRAINER = "generator", "trainer"


def label(name: str, index: int, count: int) -> str:
    """How a reason names a process: its role, with its index where the role has several
    processes (``generator 1``; ``generator`` when it is the only one)."""
    return name if count == 1 else f"{name} {index}"


def generator_of(trainer: int, generators: int) -> int:
    """The index (among the generators) of the generator that serves trainer ``trainer``."""
    return trainer % generators


def trainers_of(generator: int, trainers: int, generators: int) -> tuple[int, ...]:
    """The trainers generator ``generator`` serves, in rank order (the order it takes
    their requests and makes their batches in; the first sends it the stop)."""
    return tuple(r for r in range(trainers) if generator_of(r, generators) == generator)


@dataclass(frozen=True)
class Role:
    """One process's part in the job."""

    name: str
    """``generator`` or ``trainer``."""
    index: int
    """Its place among the processes of its role (a trainer's is its rank among the
    trainers: what its checkpoint files, its share of the prompts and its rollout seed are
    named by, the same as the rank of a run without generators)."""
    count: int
    """Processes of this role in the job."""
    trainers: int
    """Trainer processes in the job (ranks ``0 .. trainers - 1``; the generators follow)."""
    generators: int
    """Generator processes in the job (the last ranks; 0: every rank trains)."""

    @property
    def first_generator(self) -> int:
        """The global rank of generator 0."""
        return self.trainers

    @property
    def records_progress(self) -> bool:
        """This process writes progress.json (trainer 0 alone)."""
        return self.name == TRAINER and self.index == 0

    @property
    def label(self) -> str:
        """How a reason names this process (:func:`label`)."""
        return label(self.name, self.index, self.count)

    @property
    def peers(self) -> tuple[int, ...]:
        """The global ranks this process exchanges messages with: a trainer, its
        generator's (``T + r % G``); a generator, the trainers it serves
        (:func:`trainers_of`; trainers' global ranks are their indexes)."""
        if not self.generators:  # every rank trains: no messages
            return ()
        if self.name == TRAINER:
            return (self.first_generator + generator_of(self.index, self.generators),)
        return trainers_of(self.index, self.trainers, self.generators)

    @property
    def stops_generator(self) -> bool:
        """A trainer that tells its generator the trainers are done: the first trainer the
        generator serves (the one whose request it waits for first)."""
        peers = self.peers
        if self.name != TRAINER or not peers:
            return False
        generator = peers[0] - self.first_generator
        return trainers_of(generator, self.trainers, self.generators)[0] == self.index

    @property
    def generator_ranks(self) -> tuple[int, ...]:
        """Every generator's global rank (trainer 0 sends each its hello)."""
        return tuple(range(self.first_generator, self.first_generator + self.generators))


def role_of(cfg: Config, rank: int, world_size: int) -> Role:
    """The role of global ``rank`` of ``world_size`` processes under ``cfg``."""
    g = cfg.rollout.generators if cfg.rollout.placement == "split" else 0
    t = world_size - g
    if rank < t:
        return Role(TRAINER, rank, t, t, g)
    return Role(GENERATOR, rank - t, g, t, g)
