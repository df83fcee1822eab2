"""Megatron-Core's pipeline layout string, read as layers per model chunk.

Megatron-Core (``--pipeline-model-parallel-layout``, Megatron-Bridge's
``pipeline_model_parallel_layout``) describes an uneven pipeline split as one string:
model chunks in stage order separated by ``|``, each a run of layer letters: ``E`` the
embedding, ``t`` a transformer layer, ``L`` the LM head and loss, ``m`` a multi-token
prediction layer. ``x*n`` repeats a letter, ``(...)*n`` a group, and commas are only
for the eye. ``Et*2|(t*2|)*34,t*3|(t*2|)*3,tL`` is 40 chunks: the embedding and two layers,
34 chunks of two, one of three, three of two, and one layer with the loss.

The embedding opens the first chunk and the loss closes the last, once each, as
Megatron-Core requires (``PipelineParallelLayerLayout.validate_layer_layout``); those are
where mpsim places them too, so a layout string is the list of ``t`` counts that
``parallel.layers_per_stage`` takes (stage order: chunk ``v`` of pipeline rank ``r`` is
entry ``v * pp + r``, as in Megatron). The count of chunks and of layers is checked
where the list is (``mpsim/specs/pipeline_split.py``).
"""

from __future__ import annotations

import re

LETTERS = "EtLm"  # embedding, transformer layer, loss, multi-token prediction layer
_GROUP = re.compile(r"\(([^()]+)\)\*(\d+)")
_LETTER = re.compile(r"([EtLm])\*(\d+)")


def layers_from_layout(text: str) -> list[int]:
    """Transformer layers of each model chunk of a Megatron-Core layout string (ValueError if malformed)."""
    flat = text.replace(",", "")
    stray = sorted(set(flat) - set(LETTERS) - set("|()*0123456789"))
    if stray:
        raise ValueError(f"layout {text!r}: {stray[0]!r} is not a layout character (E embedding, t transformer "
                         f"layer, L loss, m multi-token prediction, | between model chunks, x*n and (...)*n repeats)")
    # groups first, innermost out, then single letters
    while _GROUP.search(flat):
        flat = _GROUP.sub(lambda match: match.group(1) * int(match.group(2)), flat)
    flat = _LETTER.sub(lambda match: match.group(1) * int(match.group(2)), flat)
    if set(flat) & set("()*0123456789"):
        raise ValueError(f"layout {text!r}: a repeat is malformed (write x*n or (...)*n, n a whole number)")
    if "m" in flat:
        raise ValueError(f"layout {text!r}: multi-token prediction layers (m) are not modelled; leave them out")
    letters = flat.replace("|", "")
    if not letters.startswith("E") or letters.count("E") != 1:
        raise ValueError(f"layout {text!r}: the embedding (E) must open the first model chunk, once")
    if not letters.endswith("L") or letters.count("L") != 1:
        raise ValueError(f"layout {text!r}: the loss (L) must close the last model chunk, once")
    return [chunk.count("t") for chunk in flat.split("|")]
