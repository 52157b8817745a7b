"""What a run tells the person watching it: the layout line, startup phases, progress lines, the summary.

Pure text from the config and the step results; nothing here imports torch or DeepSpeed, so
`ds-hetero validate` can print the layout line without them. Entry points (the recipes, the
Trainer and Accelerate integrations) decide where the text goes and which rank prints it.
"""

from .layout_line import DataSource, data_source, layout_line

__all__ = ["DataSource", "data_source", "layout_line"]
