"""Write vitscale/models/zoo.json, the rows ``vitscale models`` prints for the built-in variants, from
the models themselves: every variant of every built-in family built on the meta device (its
parameters counted), its forward FLOPs from the family's own count
(``vitscale.commands.models.measured_row``).

    python scripts/make_zoo.py            # writes vitscale/models/zoo.json
    python scripts/make_zoo.py --check    # exit 1 when the file differs (tests/unit/test_models_command.py checks it)

Add, remove or change a variant, then run it: the command reads the file instead of importing torch
and building every model (15 s on a loaded 2-core machine, against a fraction of a second).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vitscale.commands.models import ZOO, measured_row  # noqa: E402
from vitscale.registry import FAMILIES  # noqa: E402

ABOUT = ("The rows `vitscale models` prints for the built-in variants: parameters counted on each model built on the "
         "meta device, forward FLOPs per sample from its family's count. Written by scripts/make_zoo.py (do not edit: "
         "run it after changing a variant); tests/unit/test_models_command.py checks it against the models.")  # fmt: skip


def render() -> str:
    families = {}
    for name in FAMILIES.builtin:
        spec = FAMILIES.get(name)
        families[name] = [measured_row(spec, v) for v in spec.variants]
    rows = ",\n".join(f'    "{f}": [\n' + ",\n".join(f"      {json.dumps(r)}" for r in rs) + "\n    ]" for f, rs in families.items())
    return '{\n  "about": ' + json.dumps(ABOUT) + ',\n  "families": {\n' + rows + "\n  }\n}\n"


def main() -> int:
    from generated_file import write_or_check

    return write_or_check(ZOO, render, "scripts/make_zoo.py", __doc__, "the models")


if __name__ == "__main__":
    sys.exit(main())
