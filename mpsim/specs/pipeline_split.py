"""How the layers split into pipeline chunks: evenly, as given, or provisionally for ``auto``.

The even split may count the embedding and the loss as layers, as Megatron-Core's
``account_for_embedding_in_pipeline_split`` / ``account_for_loss_in_pipeline_split`` do,
so the first and last chunks build one layer fewer. A schedule of several stage chains
(DualPipe) splits the layers into one block per stage of a chain and every chain holds
every block.
"""

from __future__ import annotations

from mpsim.specs.layout_checks import fail
from mpsim.specs.scenario import Scenario
from mpsim.specs.stack import LayerStackSpec


def layers_per_chunk(scenario: Scenario, chains: tuple[int, ...]) -> tuple[tuple[int, ...], str]:
    """(layers of each stage in global stage order, how they were split: even, given or auto)."""
    plan, model = scenario.parallel, scenario.model
    if len(set(chains)) > 1:
        raise fail("parallel.schedule", f"its pipelines (chains of {', '.join(map(str, chains))} stages) must be "
                                        f"equally long: each runs the whole model")
    # the layers split into blocks: one per stage, or one per stage of a chain when the
    # chains run the same blocks (each block then has a copy in every chain)
    num_chunks = plan.pp * plan.vpp // max(1, len(chains))
    split = "even" if plan.layers_per_stage is None else "auto" if plan.layers_per_stage == "auto" else "given"
    stack = isinstance(model, LayerStackSpec)
    what = "pipeline units (top-level layers, block repetitions)" if stack else "layers"
    ends = _embedding_and_loss_as_layers(scenario, split, stack)
    if split == "auto" and chains:
        raise fail("parallel.layers_per_stage", f"auto balancing splits one pipeline; {plan.schedule} runs "
                                                f"{len(chains)}, so give {num_chunks} block sizes or omit it")
    if split == "auto":
        if model.num_layers < num_chunks:
            raise fail("parallel.layers_per_stage", f"the model has {model.num_layers} {what}, fewer than the "
                                                    f"pp x vpp = {num_chunks} model chunks to fill")
        # a provisional even split; mpsim/resolve.py replaces it once the layout can be priced
        base, extra = divmod(model.num_layers, num_chunks)
        layers = tuple(base + (1 if k < extra else 0) for k in range(num_chunks))
    elif split == "even" and ends != (0, 0):
        layers = _split_with_ends(model.num_layers, num_chunks, ends, plan.vpp if not chains else 1)
    elif split == "even":
        if model.num_layers % num_chunks:
            raise fail("parallel.pp", f"{model.num_layers} {what} do not split evenly over "
                                      + (f"pp x vpp = {num_chunks} model chunks" if not chains else
                                         f"the {num_chunks} layer blocks of {plan.schedule}")
                                      + "; change pp/vpp or give parallel.layers_per_stage (a list, or auto)")
        layers = (model.num_layers // num_chunks,) * num_chunks
    else:
        layers = tuple(plan.layers_per_stage)
        if len(layers) != num_chunks:
            needs = f"pp x vpp = {num_chunks}" if not chains else f"one per layer block of {plan.schedule}: {num_chunks}"
            raise fail("parallel.layers_per_stage", f"has {len(layers)} entries, needs {needs}")
        if any(n < 0 for n in layers):
            raise fail("parallel.layers_per_stage", "layer counts must be >= 0")
        if sum(layers) != model.num_layers:
            raise fail("parallel.layers_per_stage",
                       f"sums to {sum(layers)} layers, but the model has "
                       + (f"{model.num_layers} {what}" if stack else f"num_layers={model.num_layers}"))
    if chains:
        layers = tuple(layers[k] for length in chains for k in range(length))  # every chain holds every block
    return layers, split


EMBEDDING_FIELD = "parallel.account_for_embedding_in_pipeline_split"
LOSS_FIELD = "parallel.account_for_loss_in_pipeline_split"


def _embedding_and_loss_as_layers(scenario: Scenario, split: str, stack: bool) -> tuple[int, int]:
    """(1 if the embedding counts as a layer, 1 if the loss does) for the even split; checks the combinations."""
    plan = scenario.parallel
    ends = (int(plan.account_for_embedding_in_pipeline_split), int(plan.account_for_loss_in_pipeline_split))
    if ends == (0, 0):
        return ends
    field = EMBEDDING_FIELD if ends[0] else LOSS_FIELD
    if stack:
        raise fail(field, "a layer stack's embedding and loss are pipeline units of their own already; "
                          "set it to false")
    if split != "even":
        # Megatron-Core refuses it with an explicit layout too (TransformerConfig.__post_init__)
        raise fail(field, f"applies to the even split only; parallel.layers_per_stage is {split} here, so "
                          f"put the lighter first/last chunks into that list or omit it")
    return ends


def _split_with_ends(num_layers: int, num_chunks: int, ends: tuple[int, int], vpp: int) -> tuple[int, ...]:
    """Megatron-Core's even split with the embedding and/or loss counted as layers.

    As ``get_num_layers_to_build`` (megatron/core/transformer/transformer_block.py): the
    layers plus one per counted end divide evenly over the pipeline ranks and then over
    each rank's ``vpp`` chunks; the first chunk builds one layer less for the embedding,
    the last one less for the loss.
    """
    total = num_layers + sum(ends)
    field = EMBEDDING_FIELD if ends[0] else LOSS_FIELD
    counted = " + ".join(["the embedding"] * ends[0] + ["the loss"] * ends[1])
    ranks = num_chunks // vpp
    if total % ranks or (total // ranks) % vpp:
        raise fail(field, f"{num_layers} layers + {counted} = {total} do not split evenly over {num_chunks} model "
                          f"chunks ({ranks} pipeline ranks x {vpp}); change pp/vpp or set it to false")
    per_chunk = total // num_chunks
    layers = [per_chunk] * num_chunks
    layers[0] -= ends[0]
    layers[-1] -= ends[1]
    if min(layers) < 0:
        raise fail(field, f"a model chunk of {per_chunk} layers cannot give one up for {counted}")
    return tuple(layers)
