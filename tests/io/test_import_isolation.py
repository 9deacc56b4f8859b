from __future__ import annotations

import subprocess
import sys


def test_importing_io_does_not_import_torch_or_transformers() -> None:
    code = (
        "import sys, astrai_batch.io, astrai_batch.io.constraint_fields, "
        "astrai_batch.engine.sampling.constraints, astrai_batch.engine.sampling.params; "
        "print(sorted(m for m in ('torch', 'transformers', 'xgrammar') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
