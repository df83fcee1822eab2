"""``mpsim import-torch``: write a layer-stack model file from a PyTorch model factory."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mpsim.errors import InputError


def _shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(part) for part in text.replace("x", ",").split(",") if part.strip())
    except ValueError:
        shape = ()
    if not shape or any(size <= 0 for size in shape):
        raise InputError("expected positive sizes of one sample, without the batch, e.g. 3,224,224", "--input-shape")
    return shape


def _import(args: argparse.Namespace) -> int:
    from mpsim.torchio import require_torch

    require_torch()  # one line saying how to install it, before any of the user's code runs
    import yaml
    from pydantic import ValidationError

    from mpsim.specs.stack import LayerStackSpec
    from mpsim.torchio.importer import import_model

    data = import_model(args.factory, _shape(args.input_shape), name=args.name, token_ids=args.token_ids,
                        loss=args.loss)
    try:
        LayerStackSpec.model_validate(data)  # what we write must load
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        layer = data["layers"][first["loc"][1]]["name"] if len(first["loc"]) > 1 and first["loc"][0] == "layers" \
            and isinstance(first["loc"][1], int) else ""
        raise InputError(f"cannot import module {layer or where!r}: {first['msg'].removeprefix('Value error, ')}",
                         args.factory) from None
    text = yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=110)
    if args.output:
        Path(args.output).write_text(text)
        kinds = [layer["kind"] for layer in data["layers"]]
        print(f"{args.output}: {len(kinds)} layers ({kinds.count('custom')} measured as custom); run it with a "
              f"scenario whose model is this file", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``import-torch`` to the command parser."""
    cmd = commands.add_parser("import-torch", help="write a layer-stack model file from a PyTorch model "
                                                   "(runs your code, on the meta device)")
    cmd.add_argument("factory", help="FILE.py:FUNCTION or MODULE:FUNCTION returning a torch.nn.Module")
    cmd.add_argument("--input-shape", required=True, metavar="SIZES",
                     help="one sample's input without the batch dimension, e.g. 3,224,224")
    cmd.add_argument("--token-ids", action="store_true", help="the input is integer token ids (an embedding first)")
    cmd.add_argument("--name", help="model name (default: the factory's file or module)")
    cmd.add_argument("--loss", choices=["cross_entropy", "none"], default="cross_entropy",
                     help="loss appended to the model's output (default: cross_entropy over its last dimension)")
    cmd.add_argument("-o", "--output", metavar="FILE", help="write the YAML here (default: standard output)")
    cmd.set_defaults(handler=_import)
