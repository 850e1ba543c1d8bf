"""A trainer rank: builds its Megatron shard, then executes the controller's commands.

The root of each data-parallel replica (wire/layout.py replica_ranks) receives the controller's
commands for the replica and broadcasts each to the replica's other ranks (runtime/broadcast.py),
so all trainer ranks enter each collective (training step, weight export, checkpoint) together; a
batch arrives as the replica's share (a TrainShard), never whole. Trainer 0 (the root of replica
0) reports steps and checkpoints. Each pipeline stage's leader also sends that stage's weights to
the generators.
"""

from __future__ import annotations

import logging
import os

from areal_hpc.controller.checkpoint import hf_dir, trainer_dir
from areal_hpc.runtime import fault
from areal_hpc.runtime.broadcast import broadcast, group_comm
from areal_hpc.wire.device import device_of
from areal_hpc.wire.layout import (
    CONTROLLER_RANK,
    Role,
    check_trainer_task,
    generator_ranks,
    replica_ranks,
    trainer_ranks,
)
from areal_hpc.wire.messages import (
    CheckpointSaved,
    LaunchPlan,
    SaveCheckpoint,
    Shutdown,
    StepDone,
    TrainerGroupAddress,
    TrainShard,
    UpdateWeights,
    WeightGroupAddress,
    WeightsSent,
    WorkerReady,
)
from areal_hpc.wire.network import free_port, node_address
from areal_hpc.wire.transport import Channel

log = logging.getLogger(__name__)


def _address(plan: LaunchPlan) -> str:
    """Where this rank's listeners meet the other nodes: the interface that reaches rank 0."""
    return node_address(plan.config.cluster.network_interface, toward=plan.lifeline[0])


def _join_trainer_group(plan: LaunchPlan, chan: Channel, index: int) -> None:
    from areal_hpc.trainer.parallel import init_trainer_world

    ranks = trainer_ranks(plan.config)
    if index == 0:
        address = TrainerGroupAddress(_address(plan), free_port())
        for r in ranks[1:]:
            chan.send(r, address)
    else:
        _, address = chan.recv(ranks[0])
    init_trainer_world(plan.config, index, len(ranks), f"tcp://{address.host}:{address.port}")


def _weight_sender(plan: LaunchPlan, chan: Channel, stage: int, generators: tuple[int, ...]):
    """Announce this stage's weight group of `generators` to the controller, then wait for them
    to join. A new group, on a new port, each time the live generators change."""
    from areal_hpc.rollout.weight_transfer import WeightSender

    cfg = plan.config
    world = 1 + len(generators) * cfg.generator.tensor_parallel_size
    address = WeightGroupAddress(stage, _address(plan), free_port(), world, generators)
    chan.send(CONTROLLER_RANK, address)
    backend = "nccl" if device_of(cfg) == "cuda" else "gloo"
    return WeightSender(address.host, address.port, world, backend, timeout_s=cfg.startup_timeout_s)


def _send_weights(sender, engine, version: int, buckets, bucket_bytes: int) -> WeightsSent:
    """Send `version` to the stage's weight group. A transport failure (a generator died
    mid-transfer) is reported, not raised: the controller sends the update again without it, in a
    new group. The rest of the buckets are still gathered, which the stage's other ranks take part in."""
    from areal_hpc.rollout.weight_transfer import WeightTransferError

    stage = engine.ranks.pp_rank
    try:
        return WeightsSent(stage, version, sender.send(version, buckets, plan=engine.hf_weight_plan(bucket_bytes)))
    except (RuntimeError, WeightTransferError) as e:
        for _ in buckets:
            pass
        log.warning("stage %d: sending version %d failed: %s", stage, version, e)
        sender.close()
        return WeightsSent(stage, version, error=str(e))


def run(plan: LaunchPlan, chan: Channel, index: int) -> None:
    from areal_hpc.trainer.engine import TrainEngine

    cfg = plan.config
    replica, members = next((d, m) for d, m in enumerate(replica_ranks(cfg)) if chan.rank in m)
    comm = group_comm(chan.comm, members)
    root = chan.rank == members[0]
    if device_of(cfg) == "cuda":  # its GPU is the plan's only if srun placed it as the plan says
        check_trainer_task(cfg, index, os.environ.get("SLURM_LOCALID"))
    _join_trainer_group(plan, chan, index)
    engine = TrainEngine(cfg)
    if engine.ranks.dp_rank != replica:
        raise RuntimeError(f"rank {chan.rank} is in data-parallel replica {replica} of the rank map"
                           f" (wire/layout.py) but Megatron made it replica {engine.ranks.dp_rank}")
    if plan.resume_dir is not None:
        engine.load_checkpoint(trainer_dir(plan.resume_dir))
    else:
        engine.load_hf(plan.model_dir)
    stage, leader = engine.ranks.pp_rank, engine.is_stage_leader
    # The stage leader's weight group and its generator ranks; groups of earlier generators (one
    # of them lost) are kept, not torn down: a teardown may wait for the dead member.
    group = 0  # the weight groups' number (UpdateWeights.group); group 0 is made at start
    sender = _weight_sender(plan, chan, stage, tuple(generator_ranks(cfg))) if leader else None
    retired = []
    chan.send(CONTROLLER_RANK, WorkerReady(chan.rank, Role.TRAINER))
    log.info("trainer rank %d ready at version %d", index, engine.version)
    while True:
        msg = broadcast(comm, chan.recv(CONTROLLER_RANK)[1] if root else None)
        if isinstance(msg, TrainShard):
            fault.check("trainer", index, "step")
            if msg.version != engine.version:
                raise RuntimeError(f"batch for version {msg.version} but the trainer is at version {engine.version}")
            metrics = engine.train_step(msg, cfg.total_steps)
            if index == 0:
                chan.send(CONTROLLER_RANK, StepDone(engine.version, metrics))
        elif isinstance(msg, UpdateWeights):
            if msg.version != engine.version:
                raise RuntimeError(f"asked to send version {msg.version} but the trainer is at {engine.version}")
            if leader and msg.group != group:
                # New members (a generator lost or a replacement joined) or a broken round: a new
                # group (the old one may have a dead member, whose socket a collective would fail on).
                if sender is not None:
                    retired.append(sender)
                log.info("stage %d: new weight group of generator ranks %s", stage, ",".join(map(str, msg.generators)))
                sender = _weight_sender(plan, chan, stage, msg.generators)
            group = msg.group
            bucket_bytes = cfg.generator.weight_bucket_bytes
            buckets = engine.iter_hf_weights(bucket_bytes)
            if sender is not None:  # streamed: a bucket is gathered while the previous one is on the wire
                sent = _send_weights(sender, engine, msg.version, buckets, bucket_bytes)
                if sent.error is not None:
                    # Destroyed (its last reference), which closes its sockets: the live members'
                    # receives end at once instead of waiting out the group's timeout.
                    sender = None
                chan.send(CONTROLLER_RANK, sent)
            elif leader:  # rank 0 numbers a broken round's next groups anew: a bug if not
                raise RuntimeError(f"stage {stage}: asked to send version {msg.version} through weight groups"
                                   f" {msg.group}, which broke in an earlier round")
            else:
                for _ in buckets:  # the stage's other TP ranks take part in the gather
                    pass
        elif isinstance(msg, SaveCheckpoint):
            engine.save_checkpoint(trainer_dir(msg.path))
            if msg.hf:  # before CheckpointSaved, so the files are in the checkpoint's manifest
                engine.export_hf(hf_dir(msg.path), source_dir=plan.model_dir)
            if index == 0:
                chan.send(CONTROLLER_RANK, CheckpointSaved(msg.path))
        elif isinstance(msg, Shutdown):
            # For the lifeline and the exit; only the root's came through chan.recv.
            chan.shutdown_seen, chan.finalize = True, msg.finalize
            break
        else:
            raise RuntimeError(f"trainer rank {index}: unexpected message {msg!r:.200}")
    if sender is not None:
        sender.close()
    from areal_hpc.trainer.parallel import leave_trainer_world

    leave_trainer_world()
    chan.flush()
