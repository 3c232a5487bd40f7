"""The X5 flow (hb_mapper makertbin, march bayes-e) writes byte-identical artifacts while the J6 flow grows
on the same core: the sample CNN's and PP-OCR cls's five artifacts against the hashes pinned in
tests/data/x5_artifact_hashes.json (regenerate after a deliberate change: see x5_artifact_hashes.py)."""
import pytest
from x5_artifact_hashes import CONVERSIONS, pinned


@pytest.mark.parametrize("name", sorted(CONVERSIONS))
def test_x5_artifacts_are_byte_identical(tmp_path, name):
    got = CONVERSIONS[name](str(tmp_path / name))
    want = pinned()[name]
    assert sorted(got) == sorted(want)
    changed = {f: (want[f][:12], got[f][:12]) for f in want if got[f] != want[f]}
    assert not changed, ("X5 artifacts changed (pinned, now); if deliberate, regenerate with "
                         f"'python tests/host/x5_artifact_hashes.py --write': {changed}")
