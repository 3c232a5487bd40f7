"""ConfigError: a yaml config that hb_mapper cannot use.

The message follows the real tool's console (ptq_guide, "Interpretation of
conversion results")::

    Key 'model_parameters' error:
    Missing keys: 'caffe_model', 'prototxt'
    yaml file parse failed. Please double check your input

The first lines say what is wrong and where (the group, then the key); the last
line is the tool's fixed verdict. A ``Hint:`` follows where it helps.
"""
from typing import Optional

from bpuemu.common.errors import InvalidInput

PARSE_FAILED = "yaml file parse failed. Please double check your input"


def key_error(group: Optional[str], detail: str, key: Optional[str] = None) -> str:
    """Format ``detail`` the way schema reports an error under a group (and key)."""
    if key:
        detail = f"{key}: {detail}"
    return f"Key '{group}' error:\n{detail}" if group else detail


class ConfigError(InvalidInput):
    """The yaml config is unreadable, incomplete or inconsistent."""

    def __init__(self, detail: str, hint: str = "", *, group: Optional[str] = None, key: Optional[str] = None):
        super().__init__(f"{key_error(group, detail, key)}\n{PARSE_FAILED}", hint)
        #: What is wrong, without the group header and the verdict line.
        self.detail = detail
        self.group = group
        self.key = key
