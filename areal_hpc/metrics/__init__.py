"""Per-step training metrics: computed from batches and clocks, written as JSON lines and
TensorBoard events, shown as a progress line, summarised as a table and a plot."""
