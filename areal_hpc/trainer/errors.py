"""What the trainer rejects as the user's fault: each message names the offending item."""

from areal_hpc.errors import ConfigError, UserError


class ParallelConfigError(ConfigError):
    """A trainer layout (tp, pp, dp, world size, device) that cannot run this model."""


class WeightsError(UserError):
    """A checkpoint whose tensors are missing, unexpected or of the wrong shape."""


class BatchError(UserError):
    """A training batch that cannot be trained on (inconsistent or over-long sequences)."""
