from __future__ import annotations

import subprocess
import sys


def test_importing_io_does_not_import_torch_or_transformers() -> None:
    code = (
        "import sys, astrai_batch.io; "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
