"""TrainEngine: one trainer rank's Megatron-core model, optimizer and training steps.

Built on every trainer rank after `parallel.init_trainer_world`. Every public method is collective:
all trainer ranks call it, and every rank returns the same metrics. train_step takes the rank's
data-parallel replica's TrainShard (trainer/batch_plan.py); the other methods take the same
arguments on every rank, and each data-parallel rank takes its own token-balanced part.

A training step (the AReaL paper's decoupled PPO):
1. advantages from the rewards of the whole batch (cfg.ppo.adv_norm), by the batch plan;
2. the batch is cut into cfg.ppo.minibatches token-balanced minibatches, each minibatch into one
   share per data-parallel rank (by the batch plan, before the batch reaches the trainer); here
   each share is cut into packed, padding-free micro-batches (Algorithm 1);
3. pi_prox: one no-grad forward pass over the replica's shares with the weights before the step;
4. per minibatch: Megatron's forward-backward schedule (1F1B when pipelined) on the decoupled
   PPO loss, normalised by the output tokens of the whole minibatch, then one optimizer step; an
   fp16 step the loss scaler skips is run again under the lowered scale (trainer/loss_scale.py).
The policy version then goes up by one: it counts applied updates only.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import TypeVar

import torch
import torch.distributed as dist

from areal_hpc.config.hf import read_hf_config, shape_mismatches
from areal_hpc.config.schema import ExperimentConfig
from areal_hpc.trainer import checkpoint, cpu_compat, hf_export
from areal_hpc.trainer.batch_plan import dp_split
from areal_hpc.trainer.convert import stage_rules, to_shard
from areal_hpc.trainer.errors import BatchError, WeightsError
from areal_hpc.trainer.hf_checkpoint import HFCheckpoint, read_token_ids
from areal_hpc.trainer.logprobs import token_logprobs
from areal_hpc.trainer.loss_scale import MIN_LOSS_SCALE, futile_skip
from areal_hpc.trainer.microbatch import PackedMicroBatch, TokenSequence, pack
from areal_hpc.trainer.model import build_gpt, params_dtype
from areal_hpc.trainer.packing import allocate_micro_batches
from areal_hpc.trainer.parallel import rank_info
from areal_hpc.trainer.ppo_loss import decoupled_ppo_terms, sft_loss_terms
from areal_hpc.wire.device import device_of
from areal_hpc.wire.messages import TrainShard, Trajectory

# Sums reduced over ranks for the metrics of a step, and maxima.
_SUMS = ("loss", "tokens", "clipped", "capped", "behav_weight", "approx_kl", "mismatch", "mismatch_tokens",
         "trajectories")
_MAXES = ("behav_weight_max", "mismatch_max", "dp_tokens")
_T = TypeVar("_T")


class TrainEngine:
    """The trainer of one rank; see the module docstring for what a step does."""

    def __init__(self, cfg: ExperimentConfig):
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.distributed.finalize_model_grads import finalize_model_grads
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        self.cfg = cfg
        self.device = device_of(cfg)
        self.ranks = rank_info()
        r = self.ranks
        self.model = build_gpt(cfg, self.device, r.first_stage, r.last_stage)
        self.rules = stage_rules(cfg.model, r.pp_rank, r.pp_size, te_names=self.device == "cuda")
        self._check_rules()
        t, o = cfg.trainer, cfg.optimizer
        dtype = params_dtype(cfg, self.device)
        with cpu_compat.cuda_as_cpu():
            self.ddp = DistributedDataParallel(
                self.model.config,
                DistributedDataParallelConfig(
                    grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                    use_distributed_optimizer=t.distributed_optimizer,
                ),
                module=self.model,
            )
            self.optimizer = get_megatron_optimizer(
                OptimizerConfig(
                    optimizer="adam", lr=o.lr, min_lr=o.lr, weight_decay=o.weight_decay,
                    adam_beta1=o.beta1, adam_beta2=o.beta2, adam_eps=o.eps, clip_grad=o.grad_clip,
                    bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16, params_dtype=dtype,
                    initial_loss_scale=t.initial_loss_scale, min_loss_scale=MIN_LOSS_SCALE,
                    use_distributed_optimizer=t.distributed_optimizer,
                ),
                [self.ddp],
            )
        config = self.model.config
        config.finalize_model_grads_func = finalize_model_grads
        config.no_sync_func = self.ddp.no_sync
        if dtype == torch.float16:
            config.grad_scale_func = self.optimizer.scale_loss
        self.total_steps = cfg.total_steps
        self.scheduler = self._make_scheduler(cfg.total_steps)
        # Policy version: training steps taken (SFT steps do not count).
        self.version = 0
        self.optimizer_steps = 0
        self._hf_source: Path | None = None

    # ---------------------------------------------------------------- layout

    @property
    def is_stage_leader(self) -> bool:
        """tp_rank 0 of data-parallel replica 0: receives full tensors from iter_hf_weights."""
        return self.ranks.stage_leader

    def _check_rules(self) -> None:
        params = {n for n, _ in self.model.named_parameters()}
        mapped = {rule.megatron for rule in self.rules}
        if params != mapped:
            raise RuntimeError(
                f"weight mapping out of step with the model: unmapped {sorted(params - mapped)},"
                f" absent {sorted(mapped - params)}"
            )

    def _schedule(self, total_steps: int) -> dict:
        """Constant lr after a linear warmup over warmup_ratio of the optimizer steps (one per
        minibatch), starting at lr / (warmup + 1) so that no step runs with a zero lr."""
        o = self.cfg.optimizer
        updates = max(1, total_steps * self.cfg.ppo.minibatches)
        warmup = round(o.warmup_ratio * updates)
        return {"init_lr": o.lr / (warmup + 1), "lr_warmup_steps": warmup,
                "lr_decay_steps": max(updates, warmup + 1), "wd_incr_steps": updates}

    def _make_scheduler(self, total_steps: int):
        from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

        o = self.cfg.optimizer
        return OptimizerParamScheduler(
            self.optimizer, max_lr=o.lr, min_lr=o.lr, lr_decay_style="constant", start_wd=o.weight_decay,
            end_wd=o.weight_decay, wd_incr_style="constant", **self._schedule(total_steps),
        )

    def _set_total_steps(self, total_steps: int) -> None:
        if total_steps == self.total_steps:
            return
        self.total_steps = total_steps
        for key, value in self._schedule(total_steps).items():
            setattr(self.scheduler, key, value)
        self.scheduler.step(0)

    # ---------------------------------------------------------------- weights in and out

    def load_hf(self, path: str | Path) -> None:
        """Load a Hugging Face Qwen2 checkpoint into this rank's shards (reading only those)."""
        path = Path(path)
        hf = read_hf_config(path)
        problems = shape_mismatches(self.cfg.model, hf)
        if problems:
            raise WeightsError(f"{path}/config.json does not match the model config: " + "; ".join(problems))
        ckpt = HFCheckpoint(path)
        ckpt.check(self.cfg.model)
        params = dict(self.model.named_parameters())
        r = self.ranks
        with torch.no_grad():
            for rule in self.rules:
                shard = to_shard(rule, [ckpt.get(n) for n in rule.hf], self.cfg.model, r.tp_rank, r.tp_size)
                params[rule.megatron].copy_(shard)
        self.optimizer.reload_model_params()
        self._hf_source = path

    def iter_hf_weights(self, bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """This pipeline stage's full tensors by Hugging Face name, in buckets of ~bucket_bytes.

        Collective over the stage's tensor-parallel group: every TP rank of the stage must iterate
        it in step. Every rank gets the same number of buckets; only the stage leader's
        (is_stage_leader) hold tensors, the others are empty lists. Data-parallel replicas other
        than the first do no communication. A tensor larger than bucket_bytes is a bucket alone.
        Tensors may share storage with the live parameters: send or copy them before the next step.
        """
        return hf_export.stream(self.model, self.rules, self.cfg.model, self.ranks, bucket_bytes)

    def hf_weight_plan(self, bucket_bytes: int) -> list[list[tuple[str, torch.Tensor]]]:
        """What iter_hf_weights(bucket_bytes) yields on the stage leader, as meta tensors."""
        return hf_export.plan(self.model, self.rules, self.cfg.model, self.ranks, bucket_bytes)

    def export_hf(self, out_dir: str | Path, tokenizer_dir: str | Path | None = None,
                  source_dir: str | Path | None = None) -> Path:
        """Write a Hugging Face directory (config, generation config, sharded safetensors + index,
        tokenizer files).

        Collective over all trainer ranks. Stage leaders write their own stage's files, so no rank
        holds the whole model. The special token ids come from `source_dir`, the Hugging Face
        directory the run started from (default: the one given to load_hf; a resumed engine
        loaded none). Tokenizer files come from `tokenizer_dir`, else cfg.model.tokenizer_path,
        else that directory.
        """
        source = Path(source_dir) if source_dir is not None else self._hf_source
        tokenizer = tokenizer_dir or self.cfg.model.tokenizer_path or source
        dtype = params_dtype(self.cfg, self.device)
        return hf_export.export(
            Path(out_dir), self.iter_hf_weights(hf_export.EXPORT_BUCKET_BYTES), self.cfg.model, self.ranks,
            dtype, read_token_ids(source) if source else {}, Path(tokenizer) if tokenizer else None,
        )

    def save_checkpoint(self, path: str | Path) -> None:
        """Megatron distributed checkpoint of model, optimizer, scheduler and step counters."""
        checkpoint.save(Path(path), self.ddp, self.optimizer, self.scheduler, self._counters())

    def load_checkpoint(self, path: str | Path) -> None:
        counters = checkpoint.load(Path(path), self.ddp, self.optimizer, self.scheduler)
        self.version = counters["version"]
        self.optimizer_steps = counters["optimizer_steps"]
        self.total_steps = counters["total_steps"]

    def _counters(self) -> dict[str, int]:
        return {"version": self.version, "optimizer_steps": self.optimizer_steps, "total_steps": self.total_steps}

    # ---------------------------------------------------------------- batches

    def _fitting(self, seq: TokenSequence, where: str) -> TokenSequence:
        budget = self.cfg.trainer.micro_batch_tokens
        if seq.length > budget:
            raise BatchError(f"{where}: {seq.length} tokens, more than trainer.micro_batch_tokens = {budget}")
        return seq

    def _sequences(self, trajectories: list[Trajectory]) -> list[TokenSequence]:
        seqs = []
        for t in trajectories:
            where = f"trajectory (prompt_id {t.prompt_id}, sample {t.sample_index})"
            if len(t.prompt_ids) == 0 or len(t.output_ids) == 0:
                raise BatchError(f"{where}: needs at least one prompt and one output token")
            if not len(t.output_ids) == len(t.logprobs) == len(t.versions):
                raise BatchError(
                    f"{where}: {len(t.output_ids)} output tokens but {len(t.logprobs)} logprobs and"
                    f" {len(t.versions)} versions"
                )
            seqs.append(self._fitting(TokenSequence(t.prompt_ids, t.output_ids, {"behav": t.logprobs}), where))
        return seqs

    def _own(self, seqs: list[TokenSequence]) -> list[int]:
        """This data-parallel rank's token-balanced part of `seqs`."""
        return dp_split([s.length for s in seqs], self.ranks.dp_size)[self.ranks.dp_rank]

    def _micro_batches(self, seqs: list[TokenSequence], members: list[int]) -> list[list[int]]:
        t = self.cfg.trainer
        groups = allocate_micro_batches([seqs[i].length for i in members], t.micro_batch_tokens, t.min_micro_batches)
        return [[members[j] for j in g] for g in groups]

    def _pack(self, seqs: list[TokenSequence], groups: list[list[int]]) -> Iterator[PackedMicroBatch]:
        # Sequence parallelism splits the token axis over TP ranks: pad it to a multiple of tp
        # (at most tp - 1 tokens beyond the budget; the padding is never scored).
        multiple = self.ranks.tp_size if self.cfg.trainer.sequence_parallel else 1
        for g in groups:
            yield pack(seqs, g, self.device, multiple)

    # ---------------------------------------------------------------- forward / backward

    def _token_logprobs(self, output: torch.Tensor, mb: PackedMicroBatch) -> torch.Tensor:
        """log pi(label) at every position, from vocab-parallel logits [1, T, V/tp], in chunks of
        trainer.logprob_chunk_tokens (trainer/logprobs.py: no fp32 copy of all the logits)."""
        from megatron.core import parallel_state

        return token_logprobs(
            output[0], mb.labels, self.cfg.rollout.temperature, self.cfg.trainer.logprob_chunk_tokens,
            parallel_state.get_tensor_model_parallel_group(), self.ranks.tp_rank,
        )

    def _run(self, groups: list[list[int]], seqs: list[TokenSequence], loss: Callable, forward_only: bool) -> list:
        """Megatron's forward-backward schedule over packed micro-batches; per-micro-batch outputs
        of `loss` on the last pipeline stage, [] elsewhere."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        def forward_step(data_iterator, model):
            mb = next(data_iterator)
            output = model(mb.tokens, None, None, packed_seq_params=mb.packed_seq_params())
            return output, partial(loss, mb)

        longest = max(sum(seqs[i].length for i in g) for g in groups)
        context = torch.no_grad() if forward_only else torch.enable_grad()
        with context:
            return get_forward_backward_func()(
                forward_step_func=forward_step, data_iterator=self._pack(seqs, groups), model=[self.ddp],
                num_microbatches=len(groups), seq_length=longest, micro_batch_size=1,
                forward_only=forward_only,
            )

    def _logprobs_loss(self, mb: PackedMicroBatch, output: torch.Tensor):
        lp = self._token_logprobs(output, mb).detach()
        return torch.zeros((), device=lp.device), {"members": mb.members, "logprobs": mb.per_sequence(lp.cpu())}

    def _forward_logprobs(self, seqs: list[TokenSequence], members: list[int]) -> dict[int, torch.Tensor]:
        """Current-weight log-probs of the output tokens of `members` (last pipeline stage only)."""
        outputs = self._run(self._micro_batches(seqs, members), seqs, self._logprobs_loss, forward_only=True)
        return {i: lp for out in outputs for i, lp in zip(out["members"], out["logprobs"], strict=True)}

    def _optimizer_step(self) -> float | None:
        """One optimizer step on the gradients in the buffers: their norm, or None when the fp16
        loss scaler found them not finite and skipped the step (weights, lr schedule and
        optimizer_steps unchanged; the scaler lowers its scale), as Megatron's own loop does."""
        with cpu_compat.cuda_as_cpu():
            applied, grad_norm, _ = self.optimizer.step()
        if not applied:
            return None
        self.scheduler.step(increment=1)
        self.optimizer_steps += 1
        return float(grad_norm) if grad_norm is not None else math.nan

    def _loss_scale(self) -> float:
        """The fp16 loss scale of the next backward pass (1.0 without fp16)."""
        return float(self.optimizer.get_loss_scale())

    def _step_minibatch(self, backward: Callable[[], _T]) -> tuple[_T, float, int]:
        """`backward()` (which zeroes the gradients first) and one optimizer step, run again while
        the step is skipped (trainer/loss_scale.py): the applied attempt's `backward()` result,
        its gradient norm and the number of skipped attempts. Raises when retrying is futile."""
        skipped = 0
        while True:
            result = backward()
            scale = self._loss_scale()
            grad_norm = self._optimizer_step()
            if grad_norm is not None:
                return result, grad_norm, skipped
            skipped += 1
            why = futile_skip(scale, skipped)
            if why is not None:
                raise RuntimeError(f"training step for version {self.version + 1}: {why}")

    def _ppo_backward(self, groups: list[list[int]], seqs: list[TokenSequence]) -> list[dict[str, float]]:
        """Fresh gradients of one minibatch's PPO loss; per-micro-batch statistics (last stage)."""
        self._zero_grad()
        return self._run(groups, seqs, self._ppo_loss, forward_only=False)

    def _zero_grad(self) -> None:
        self.ddp.zero_grad_buffer()
        self.optimizer.zero_grad()

    # ---------------------------------------------------------------- reductions

    @property
    def _reporter(self) -> bool:
        """One rank per data-parallel replica reports loss statistics (TP ranks hold copies)."""
        return self.ranks.last_stage and self.ranks.tp_rank == 0

    def _reduce(self, sums: dict[str, float], maxes: dict[str, float]) -> tuple[dict[str, float], dict[str, float]]:
        """Sum / max over all trainer ranks, counting only reporting ranks' values."""
        keep = 1.0 if self._reporter else 0.0
        s = torch.tensor([sums.get(k, 0.0) * keep for k in _SUMS], dtype=torch.float64)
        m = torch.tensor([maxes.get(k, -math.inf) if keep else -math.inf for k in _MAXES], dtype=torch.float64)
        if dist.get_world_size() > 1:
            s, m = s.to(self.device), m.to(self.device)
            dist.all_reduce(s)
            dist.all_reduce(m, op=dist.ReduceOp.MAX)
        return dict(zip(_SUMS, s.tolist(), strict=True)), dict(zip(_MAXES, m.tolist(), strict=True))

    def _gather_logprobs(self, seqs: list[TokenSequence], local: dict[int, torch.Tensor]) -> list[list[float]]:
        """Every sequence's output log-probs on every rank, from the reporting ranks' parts."""
        offsets = [0]
        for s in seqs:
            offsets.append(offsets[-1] + len(s.output))
        flat = torch.zeros(offsets[-1], dtype=torch.float64)
        if self._reporter:
            for i, lp in local.items():
                flat[offsets[i]:offsets[i + 1]] = lp.double()
        if dist.get_world_size() > 1:
            flat = flat.to(self.device)
            dist.all_reduce(flat)
        values = flat.cpu().tolist()
        return [values[offsets[i]:offsets[i + 1]] for i in range(len(seqs))]

    # ---------------------------------------------------------------- public steps

    def compute_logprobs(self, trajectories: list[Trajectory]) -> list[list[float]]:
        """log pi(output token) under the current weights, for every trajectory, on every rank."""
        seqs = self._sequences(trajectories)
        local = self._forward_logprobs(seqs, self._own(seqs))
        return self._gather_logprobs(seqs, local)

    def train_step(self, shard: TrainShard, total_steps: int | None = None) -> dict[str, float]:
        """One decoupled-PPO training step on a batch, of which this rank's data-parallel replica
        trains `shard` (the other replicas their shards of the same plan); version += 1. Returns
        metrics of the whole batch: loss, clip_fraction, masked_fraction,
        importance_weight_mean/max, approx_kl, grad_norm, skipped_steps (fp16 optimizer steps the
        loss scaler skipped and that were run again), loss_scale, lr, advantage_mean, output_tokens,
        tokens, tokens_per_s, step_s, version, dp_imbalance (the largest data-parallel rank's
        tokens over the mean: 1.0 is a perfect split) and, with the decoupled objective,
        mismatch_mean/max/tokens: |generator log-prob - pi_prox log-prob| over the tokens sampled
        by the current version (the train/inference mismatch)."""
        start = time.perf_counter()
        if shard.replica != self.ranks.dp_rank or len(shard.minibatches) != self.cfg.ppo.minibatches:
            raise RuntimeError(f"data-parallel rank {self.ranks.dp_rank} got replica {shard.replica}'s shard"
                               f" of {len(shard.minibatches)} minibatches (ppo.minibatches = {self.cfg.ppo.minibatches})")
        if total_steps is not None:
            self._set_total_steps(total_steps)
        ppo = self.cfg.ppo
        seqs = self._sequences(shard.trajectories)
        for s, a in zip(seqs, shard.advantages, strict=True):
            s.values["adv"] = [a] * len(s.output)

        sums: dict[str, float] = {"trajectories": float(len(seqs))}
        maxes: dict[str, float] = {"dp_tokens": float(sum(s.length for s in seqs))}
        if ppo.decoupled:
            prox = self._forward_logprobs(seqs, list(range(len(seqs))))
            for i, lp in prox.items():
                seqs[i].values["prox"] = lp.tolist()
            self._mismatch(shard.trajectories, prox, sums, maxes)
        for s in seqs:
            s.values.setdefault("prox", s.values["behav"])

        grad_norms, skipped = [], 0
        for share in shard.minibatches:
            groups = self._micro_batches(seqs, share)
            outputs, grad_norm, skips = self._step_minibatch(partial(self._ppo_backward, groups, seqs))
            for stats in outputs:  # of the applied attempt only
                for k, v in stats.items():
                    if k in _MAXES:
                        maxes[k] = max(maxes.get(k, -math.inf), v)
                    else:
                        sums[k] = sums.get(k, 0.0) + v
            grad_norms.append(grad_norm)
            skipped += skips
        self.version += 1
        total, top = self._reduce(sums, maxes)
        if total["trajectories"] != shard.batch_trajectories:
            raise RuntimeError(f"the data-parallel replicas trained {total['trajectories']:.0f} trajectories"
                               f" of a batch of {shard.batch_trajectories}")
        tokens = total["tokens"]
        kept = tokens - total["capped"]
        elapsed = time.perf_counter() - start
        batch_tokens = shard.batch_tokens
        metrics = {
            "loss": total["loss"] / max(tokens, 1.0),
            "clip_fraction": total["clipped"] / max(kept, 1.0),
            "masked_fraction": total["capped"] / max(tokens, 1.0),
            "importance_weight_mean": total["behav_weight"] / max(tokens, 1.0),
            "importance_weight_max": top["behav_weight_max"],
            "approx_kl": total["approx_kl"] / max(kept, 1.0),
            "grad_norm": sum(grad_norms) / len(grad_norms),
            "skipped_steps": float(skipped),
            "loss_scale": self._loss_scale(),
            "lr": self.optimizer.param_groups[0]["lr"],
            "advantage_mean": shard.advantage_mean,
            "output_tokens": tokens,
            "tokens": float(batch_tokens),
            "tokens_per_s": batch_tokens / elapsed,
            "step_s": elapsed,
            "version": float(self.version),
            "dp_imbalance": top["dp_tokens"] * self.ranks.dp_size / batch_tokens,
        }
        if ppo.decoupled:
            metrics["mismatch_tokens"] = total["mismatch_tokens"]
            metrics["mismatch_mean"] = total["mismatch"] / total["mismatch_tokens"] if total["mismatch_tokens"] else 0.0
            metrics["mismatch_max"] = max(top["mismatch_max"], 0.0)
        return metrics

    def _mismatch(self, trajectories: list[Trajectory], prox: dict[int, torch.Tensor], sums: dict, maxes: dict) -> None:
        """|generator log-prob - pi_prox log-prob| over tokens sampled by the current version."""
        total, count, top = 0.0, 0, 0.0
        for i, lp in prox.items():
            t = trajectories[i]
            current = torch.as_tensor(t.versions) == self.version
            if current.any():
                diff = (torch.as_tensor(t.logprobs, dtype=torch.float64) - lp.double()).abs()[current]
                total += float(diff.sum())
                count += int(current.sum())
                top = max(top, float(diff.max()))
        sums["mismatch"], sums["mismatch_tokens"], maxes["mismatch_max"] = total, float(count), top

    def _ppo_loss(self, mb: PackedMicroBatch, output: torch.Tensor):
        ppo = self.cfg.ppo
        lp = self._token_logprobs(output, mb)
        on = mb.mask.bool()
        terms = decoupled_ppo_terms(
            lp[on], mb.values["prox"][on], mb.values["behav"][on], mb.values["adv"][on], mb.mask[on],
            clip_eps=ppo.clip_eps, behav_cap=ppo.behav_imp_weight_cap if ppo.decoupled else None,
            dual_clip=ppo.dual_clip,
        )
        stats = {
            "loss": float(terms.loss.detach()), "tokens": float(terms.tokens), "clipped": float(terms.clipped),
            "capped": float(terms.capped), "behav_weight": float(terms.behav_weight),
            "behav_weight_max": float(terms.behav_weight_max), "approx_kl": float(terms.approx_kl),
        }
        return terms.loss, terms.tokens.to(torch.int), stats

    def sft_step(self, sequences: list[tuple[list[int], list[int]]]) -> dict[str, float]:
        """One optimizer step of next-token loss on the completions of (prompt, completion) pairs.

        The whole list is one minibatch; the loss is the mean over all completion tokens."""
        start = time.perf_counter()
        seqs = self._sft_sequences(sequences)
        loss, grad_norm, skipped = self._step_minibatch(partial(self._sft_backward, seqs))
        elapsed = time.perf_counter() - start
        batch_tokens = sum(s.length for s in seqs)
        return {
            "loss": loss,
            "grad_norm": grad_norm,
            "skipped_steps": float(skipped),
            "lr": self.optimizer.param_groups[0]["lr"],
            "tokens": float(batch_tokens),
            "tokens_per_s": batch_tokens / elapsed,
            "step_s": elapsed,
        }

    def _sft_sequences(self, sequences: list[tuple[list[int], list[int]]]) -> list[TokenSequence]:
        seqs = []
        for k, (prompt, completion) in enumerate(sequences):
            if not prompt or not completion:
                raise BatchError(f"SFT sequence {k}: needs at least one prompt and one completion token")
            seqs.append(self._fitting(TokenSequence(list(prompt), list(completion)), f"SFT sequence {k}"))
        return seqs

    def _sft_backward(self, seqs: list[TokenSequence]) -> float:
        """Gradients of the mean completion NLL in the grad buffers; returns that mean."""
        self._zero_grad()
        groups = self._micro_batches(seqs, self._own(seqs))
        sums: dict[str, float] = {}
        for stats in self._run(groups, seqs, self._sft_loss, forward_only=False):
            for k, v in stats.items():
                sums[k] = sums.get(k, 0.0) + v
        total, _ = self._reduce(sums, {})
        return total["loss"] / max(total["tokens"], 1.0)

    def _sft_loss(self, mb: PackedMicroBatch, output: torch.Tensor):
        nll, tokens = sft_loss_terms(self._token_logprobs(output, mb), mb.mask)
        return nll, tokens.to(torch.int), {"loss": float(nll.detach()), "tokens": float(tokens)}
