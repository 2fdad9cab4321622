"""Quiet console defaults: the third-party output a user would otherwise learn to ignore is turned
off where it comes from; `verbose=true` leaves every library printing as it does.

What is silenced, and why it is harmless here:
- transformers' per-call bars (`Loading weights`, `Writing model shards`): the tiny model loads in
  milliseconds, and a run loads and saves models several times (a model download from the hub keeps
  its bar: that one can take minutes);
- Lightning's litlogger tip, printed whenever a run has no LitLogger;
- Lightning's own `_pytree` code calling torch's deprecated `LeafSpec` check (a Lightning matter,
  fixed there, nothing a user can act on);
- Lightning's "`Trainer.fit` stopped: `max_steps=N` reached": the run summary follows at once.
"""

from __future__ import annotations

import logging
import warnings

# Lightning's rank-zero messages go through whichever of these loggers was set up last
RANK_ZERO = ["lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"]
DROPPED = ["💡 Tip: For seamless cloud logging", "`Trainer.fit` stopped: `max_steps="]


class DropMessages(logging.Filter):
    def __init__(self, starts: list[str]) -> None:
        super().__init__()
        self.starts = tuple(starts)

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.starts)


def quiet_defaults(verbose: bool = False) -> None:
    """Apply the quiet defaults once per process (a no-op with verbose=True)."""
    if verbose:
        return
    from huggingface_hub import utils as hub_utils
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hub_utils.enable_progress_bars()  # transformers turns the hub's off too: a download keeps its bar
    for name in RANK_ZERO:
        logger = logging.getLogger(name)
        if not any(isinstance(f, DropMessages) for f in logger.filters):
            logger.addFilter(DropMessages(DROPPED))
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)",
                            module=r"lightning\.pytorch\.utilities\._pytree")
