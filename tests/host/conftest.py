"""Fixtures the host tests share."""
import os

import pytest

from real_models import MODELS


@pytest.fixture(scope="module")
def rapidocr_models():
    """The wheel's models, fetched and cached by the OCR sample's own fetch (bpuemu.host.samples.ocr.models)."""
    from bpuemu.host.samples.ocr.models import fetch

    fetched = fetch()
    assert all(os.path.basename(fetched[name]) == f for name, (f, _, _) in MODELS.items())
    return {name: fetched[name] for name in MODELS}
