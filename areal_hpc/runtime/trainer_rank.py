"""A trainer rank: builds its Megatron shard, then executes the controller's commands.

The first trainer rank receives every command from the controller and forwards it to the other
trainer ranks, so all of them enter each collective (training step, weight export, checkpoint)
together. Each pipeline stage's leader also sends that stage's weights to the generators.
"""

from __future__ import annotations

import logging

from areal_hpc.controller.checkpoint import trainer_dir
from areal_hpc.runtime import fault
from areal_hpc.runtime.layout import CONTROLLER_RANK, Role, trainer_ranks
from areal_hpc.runtime.messages import (
    CheckpointSaved,
    LaunchPlan,
    SaveCheckpoint,
    Shutdown,
    StepDone,
    TrainBatch,
    TrainerGroupAddress,
    UpdateWeights,
    WeightGroupAddress,
    WeightsSent,
    WorkerReady,
)
from areal_hpc.runtime.network import free_port, node_address
from areal_hpc.runtime.transport import Channel

log = logging.getLogger(__name__)


def _join_trainer_group(plan: LaunchPlan, chan: Channel, index: int) -> None:
    from areal_hpc.trainer.parallel import init_trainer_world

    ranks = trainer_ranks(plan.config)
    if index == 0:
        address = TrainerGroupAddress(node_address(), free_port())
        for r in ranks[1:]:
            chan.send(r, address)
    else:
        _, address = chan.recv(ranks[0])
    init_trainer_world(plan.config, index, len(ranks), f"tcp://{address.host}:{address.port}")


def _weight_sender(plan: LaunchPlan, chan: Channel, stage: int):
    """Announce this stage's weight group to the controller, then wait for the generators to join."""
    from areal_hpc.rollout.weight_transfer import WeightSender
    from areal_hpc.trainer.parallel import resolve_device

    cfg = plan.config
    world = 1 + cfg.generator.count * cfg.generator.tensor_parallel_size
    address = WeightGroupAddress(stage, node_address(), free_port(), world)
    chan.send(CONTROLLER_RANK, address)
    backend = "nccl" if resolve_device(cfg) == "cuda" else "gloo"
    return WeightSender(address.host, address.port, world, backend)


def run(plan: LaunchPlan, chan: Channel, index: int) -> None:
    from areal_hpc.trainer.engine import TrainEngine

    cfg = plan.config
    ranks = trainer_ranks(cfg)
    leader = ranks[0]
    _join_trainer_group(plan, chan, index)
    engine = TrainEngine(cfg)
    if plan.resume_dir is not None:
        engine.load_checkpoint(trainer_dir(plan.resume_dir))
    else:
        engine.load_hf(plan.model_dir)
    sender = _weight_sender(plan, chan, engine.ranks.pp_rank) if engine.is_stage_leader else None
    chan.send(CONTROLLER_RANK, WorkerReady(chan.rank, Role.TRAINER))
    log.info("trainer rank %d ready at version %d", index, engine.version)
    while True:
        if index == 0:
            _, msg = chan.recv(CONTROLLER_RANK)
            for r in ranks[1:]:
                chan.send(r, msg)
        else:
            _, msg = chan.recv(leader)
        if isinstance(msg, TrainBatch):
            fault.check("trainer", index, "step")
            if msg.version != engine.version:
                raise RuntimeError(f"batch for version {msg.version} but the trainer is at version {engine.version}")
            metrics = engine.train_step(msg.trajectories, cfg.total_steps)
            if index == 0:
                chan.send(CONTROLLER_RANK, StepDone(engine.version, metrics))
        elif isinstance(msg, UpdateWeights):
            if msg.version != engine.version:
                raise RuntimeError(f"asked to send version {msg.version} but the trainer is at {engine.version}")
            bucket_bytes = cfg.generator.weight_bucket_bytes
            buckets = engine.iter_hf_weights(bucket_bytes)
            if sender is not None:  # streamed: a bucket is gathered while the previous one is on the wire
                sums = sender.send(msg.version, buckets, plan=engine.hf_weight_plan(bucket_bytes))
                chan.send(CONTROLLER_RANK, WeightsSent(engine.ranks.pp_rank, msg.version, sums))
            else:
                for _ in buckets:  # the stage's other TP ranks take part in the gather
                    pass
        elif isinstance(msg, SaveCheckpoint):
            engine.save_checkpoint(trainer_dir(msg.path))
            if index == 0:
                chan.send(CONTROLLER_RANK, CheckpointSaved(msg.path))
        elif isinstance(msg, Shutdown):
            break
        else:
            raise RuntimeError(f"trainer rank {index}: unexpected message {msg!r:.200}")
    if sender is not None:
        sender.close()
    chan.flush()
