"""Which process does what in a run (pure): with ``rollout.placement=split`` torchrun
starts ``T + G`` ranks, the first ``T`` train and the last ``G`` generate; otherwise every
rank trains (and, asynchronous, generates in a thread of its own). docs/async.md.

Trainers first, not generators: global rank 0 is then trainer 0, the rank that libraries
take for the main process. transformers' ``save_pretrained`` writes nothing on a rank
other than 0 of an initialized process group (``should_save_on_this_rank``), so with a
generator at rank 0 the trainer wrote no ``tiny`` model and would write no export."""

from __future__ import annotations

from dataclasses import dataclass

from grpo_hpc.config.schema import Config

GENERATOR, TRAINER = "generator", "trainer"


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

    @property
    def first_generator(self) -> int:
        """The global rank of generator 0."""
        return self.trainers

    @property
    def records_progress(self) -> bool:
        """This process writes progress.json (trainer 0 alone)."""
        return self.name == TRAINER and self.index == 0


def role_of(cfg: Config, rank: int, world_size: int) -> Role:
    """The role of global ``rank`` of ``world_size`` processes under ``cfg``."""
    g = cfg.rollout.generators if cfg.rollout.placement == "split" else 0
    t = world_size - g
    if rank < t:
        return Role(TRAINER, rank, t, t)
    return Role(GENERATOR, rank - t, g, t)
