"""Decode and prefill step times of a vLLM engine, by batch size, for the simulator's fit.

vLLM's engine core reports, for every iteration, how many requests it decoded and how many
prompt tokens it prefilled (its `enable_logging_iteration_details` scheduler stats). The
iteration's own `elapsed_ms` is not used: with the single-process executor it times only the
sampler, the forward pass having run before the timer starts. The time of an iteration is instead
the shortest inter-token latency of its decoded requests: the gap between the engine core's
timestamps of this iteration's outputs and the previous one's, which every request decoded in
both shares (one preempted or queued in between has a longer one). The first iteration after a
weight update is not timed (in keep mode its latencies span the pause). Pure decode iterations are
summed per power-of-two batch size; iterations that also prefill are summed apart, with their
prompt tokens.

The sums travel to rank 0 with each WeightsLoaded message and are added into the step's
metrics.jsonl record under `gen/` (keys from `EngineStats.take`).
"""

from __future__ import annotations

from collections import defaultdict


def bucket_of(batch: int) -> int:
    """The power of two at or below `batch` (>= 1): the batch-size class of a decode step."""
    return 1 << (max(batch, 1).bit_length() - 1)


class EngineStats:
    """Sums of timed iterations since the last `take`. Not thread-safe: vLLM calls `record` from
    the engine's output handler, on the generator's event loop."""

    def __init__(self) -> None:
        self._paused = False
        self._sums: dict[str, float] = defaultdict(float)

    def interrupt(self) -> None:
        """Generation paused (a weight update): the next iteration's latencies may span the pause."""
        self._paused = True

    def observe(self, dt: float | None, decoded: int, prefill_tokens: int) -> None:
        """One engine iteration of `dt` seconds (None: untimed, no request decoded in both it and
        the previous one): `decoded` sequences got a token, `prefill_tokens` were prefilled."""
        if dt is None:
            return
        if self._paused:
            self._paused = False
            return
        if decoded:
            if prefill_tokens:
                prefix = "gen/mixed/"
                self._sums[prefix + "prefill_tokens"] += prefill_tokens
            else:
                prefix = f"gen/decode/b{bucket_of(decoded)}/"
            self._sums[prefix + "steps"] += 1
            self._sums[prefix + "s"] += dt
            self._sums[prefix + "seqs"] += decoded

    def take(self) -> dict[str, float]:
        """The sums since the previous call: `gen/decode/b<N>/{steps,s,seqs}` (decode iterations of
        N to 2N-1 sequences: count, seconds, sequences) and `gen/mixed/{steps,s,seqs,prefill_tokens}`."""
        out, self._sums = dict(self._sums), defaultdict(float)
        return out


def stat_logger_factory(stats: EngineStats):
    """A vLLM StatLoggerFactory whose loggers feed `stats` (vLLM is imported only here)."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _Logger(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0) -> None:
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
            details = None if scheduler_stats is None else scheduler_stats.iteration_details
            if details is None or details.is_dummy:
                return
            latencies = iteration_stats.inter_token_latencies_iter if iteration_stats is not None else ()
            stats.observe(min(latencies) if latencies else None, details.num_generation_requests,
                          details.num_ctx_tokens)

        def log_engine_initialized(self) -> None:
            pass

    return lambda vllm_config, engine_index=0: _Logger(vllm_config, engine_index)
