from __future__ import annotations

import subprocess
import sys


def test_importing_io_does_not_import_torch_transformers_or_pillow() -> None:
    code = (
        "import sys, astrai_batch.io, astrai_batch.io.constraint_fields, "
        "astrai_batch.io.image_sources, "
        "astrai_batch.engine.sampling.constraints, astrai_batch.engine.sampling.params; "
        "print(sorted(m for m in ('torch', 'transformers', 'xgrammar', 'PIL') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
