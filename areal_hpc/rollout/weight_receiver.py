"""The receiving side of weight transfer: a vLLM weight-transfer engine inside every vLLM worker.

vLLM builds the engine named by `weight_transfer_config.backend` through its
WeightTransferEngineFactory; importing this module registers ours ("gloo" on CPU, "areal_nccl"
on GPU). vLLM imports it inside each worker because `WeightTransferWorker` is passed as the
engine's `worker_extension_cls`. The protocol itself is in weight_transfer.py.

The whole update happens in `update_weights`: headers first, then the check against the served
checkpoint, then the refusal vote, and only then vLLM's layerwise reload. A refused update
therefore never touches the model, and a failed transfer restores every layer not yet loaded.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

from areal_hpc.errors import UserError
from areal_hpc.rollout.weight_transfer import Digests, Link, mismatches

# vLLM backend name -> transport of weight_transfer.Link
ENGINE_BACKENDS = {"gloo": "gloo", "areal_nccl": "nccl"}


@dataclass
class WeightGroupInfo(WeightTransferInitInfo):
    """Where one weight group meets: its sender's address and this generator's first rank in it,
    how long joining may wait for the other members (startup_timeout_s), and its pipeline stage:
    joining stage 0 starts a new set of groups (after a generator was lost)."""

    host: str
    port: int
    world_size: int
    rank_offset: int
    timeout_s: float
    stage: int = 0


@dataclass
class WeightUpdateInfo(WeightTransferUpdateInfo):
    """The version the generator was told to load; the senders' headers must announce it."""

    version: int


def checkpoint_shapes(model_dir: str | Path) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor in a safetensors checkpoint, read from headers only."""
    from safetensors import safe_open

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise UserError(f"{model_dir}: no *.safetensors files; weight updates are checked against them")
    shapes = {}
    for file in files:
        with safe_open(str(file), "pt") as f:
            for name in f.keys():
                shapes[name] = tuple(f.get_slice(name).get_shape())
    return shapes


class GroupWeightTransferEngine(WeightTransferEngine[WeightGroupInfo, WeightUpdateInfo]):
    """Receives updates from one or more weight groups (one per trainer pipeline stage).

    Every generator must join the groups in the same order (stage order): an update reads all
    headers, then votes in every group, then receives every group's buckets, in that order.
    """

    init_info_cls = WeightGroupInfo
    update_info_cls = WeightUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config: Any, vllm_config: Any, device: torch.device, model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self._transport = ENGINE_BACKENDS[config.backend]
        self._shapes = checkpoint_shapes(self.model_config.model)
        self._links: list[Link] = []
        # Groups of earlier members (a lost generator among them): kept, not torn down, since a
        # teardown may wait for the dead member.
        self._retired: list[Link] = []
        # Outcome of the last update, read by the generator through WeightTransferWorker.
        self.last_update: dict[str, Any] = {}

    def init_transfer_engine(self, init_info: WeightGroupInfo) -> None:
        pc = self.parallel_config
        if init_info.stage == 0:
            self._retired += self._links
            self._links = []
        rank = init_info.rank_offset + pc.data_parallel_index * pc.world_size + pc.rank
        self._links.append(Link(self._transport, init_info.host, init_info.port, rank, init_info.world_size,
                                init_info.timeout_s))

    def start_weight_update(self) -> None:
        """Nothing to prepare: the reload starts only after every receiver accepted the headers."""

    def finish_weight_update(self) -> None:
        """Nothing to finish: `update_weights` completes the reload itself."""

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # The base class synchronises through torch.accelerator, which raises on CPU.
        self.receive_weights(self.parse_update_info(update_info))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def receive_weights(self, update_info: WeightUpdateInfo) -> None:
        if not self._links:
            raise RuntimeError("no weight group joined: call Generator.init_weight_group first")
        headers = [link.recv_header() for link in self._links]
        problems = mismatches(headers, self._shapes, update_info.version)
        refusals = [link.sum(int(bool(problems))) for link in self._links]
        if problems or any(refusals):
            self.last_update = {
                "version": update_info.version,
                "refused": problems or ["another member of the weight group refused this update"],
                "checksums": {},
            }
            return
        digests = Digests()  # queued before each bucket's load (which follows on the same stream)
        initialize_layerwise_reload(self.model)
        try:
            for link, header in zip(self._links, headers, strict=True):
                for weights in link.recv_buckets(header):
                    digests.add(weights)
                    self.model.load_weights(weights)
        finally:
            # On failure this puts the old weights back into every layer not yet loaded.
            finalize_layerwise_reload(self.model, self.model_config)
        self.last_update = {"version": update_info.version, "refused": [], "checksums": digests.read()}

    def shutdown(self) -> None:
        for link in self._links:
            link.close()
        self._links = []


class WeightTransferWorker:
    """Mixed into every vLLM worker (`worker_extension_cls`): reports the last weight update."""

    def last_weight_update(self) -> dict[str, Any]:
        return self.weight_transfer_engine.last_update  # type: ignore[attr-defined]


# vLLM warns "RotaryEmbedding: Failed to load weights" at every reload: that layer has no
# checkpoint tensors and rightly keeps its cos/sin cache. Once per policy version is noise.
logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(
    lambda record: not record.getMessage().startswith("RotaryEmbedding:")
)

for _name in ENGINE_BACKENDS:
    try:
        WeightTransferEngineFactory.register_engine(_name, GroupWeightTransferEngine)
    except ValueError:  # registered already in this process
        pass
