"""Embedding tables under TP: the vocabulary table is vocab-parallel, a learned position table
stays whole on every rank (Megatron ``language_model.Embedding``: ``VocabParallelEmbedding``
for the words, a plain ``torch.nn.Embedding`` for ``position_embeddings``), and a lookup reads
only the rows it gathers.

GPT 530B (Korthikanti / SC21 shapes): vocabulary V = 51,200, 2,048 positions, hidden 20,480.
"""

from __future__ import annotations

import pytest

from charon_search.frontend import trace_model
from charon_search.ir import OpKind
from charon_search.ir.ops import POSITION_TABLE_TAG
from charon_search.memory.static import traced_param_groups
from charon_search.passes import PassContext, parallelize_block
from charon_search.passes.params import local_params

V, P, H = 51200, 2048, 20480
B, S = 1.0, 2048.0
BF16 = 2


@pytest.fixture(scope="module")
def embedding():
    return trace_model("gpt-530b", phase="train", dtype="bf16").blocks["embedding"]


def _lookups(graph):
    return {n.module_path: n for n in graph.nodes if n.kind == OpKind.EMBEDDING}


def test_the_position_table_is_tagged_the_vocabulary_is_not(embedding) -> None:
    for graph in (embedding.forward, embedding.backward):
        found = _lookups(graph)
        assert POSITION_TABLE_TAG in found["transformer.wpe"].tags
        assert POSITION_TABLE_TAG not in found["transformer.wte"].tags
    # a model without learned positions has no tagged lookup
    llama = trace_model("llama-3.1-8b", phase="train", dtype="bf16").blocks["embedding"]
    assert not any(POSITION_TABLE_TAG in n.tags for n in llama.forward.nodes)


@pytest.mark.parametrize(("tp", "sp"), [(1, False), (8, False), (8, True)])
def test_tp_shards_the_vocabulary_table_only(embedding, tp: int, sp: bool) -> None:
    pb = parallelize_block(embedding, PassContext(fused_kernels=True, tp=tp,
                                                  sequence_parallel=sp))
    assert local_params(pb.forward, tp=tp).dense_numel == V * H / tp + P * H
    groups = traced_param_groups(embedding)
    assert (groups.tp, groups.rep) == (V * H, P * H)
    assert groups.local(tp=tp, ep=1)[0] == V * H / tp + P * H
    # the position table's gradient is whole on every rank: (P x H) written, not / tp (under
    # SP too: Megatron adds the positions before it scatters to the sequence-parallel region)
    grads = _lookups(pb.backward)
    assert float(grads["transformer.wpe"].bytes_written(B, S, S)) == pytest.approx(P * H * BF16)
    assert float(grads["transformer.wte"].bytes_written(B, S, S)) == pytest.approx(
        V * H * BF16 / tp)


def test_a_lookup_reads_the_rows_it_gathers_not_the_table(embedding) -> None:
    fwd = _lookups(embedding.forward)
    rows = B * S * H * BF16
    # the word lookup: one row per token and the int64 token ids; the position lookup: one
    # row per position (shared by the batch) and the int64 positions
    assert float(fwd["transformer.wte"].bytes_read(B, S, S)) == pytest.approx(rows + B * S * 8)
    assert float(fwd["transformer.wpe"].bytes_read(B, S, S)) == pytest.approx(rows + S * 8)
    assert float(fwd["transformer.wte"].bytes_read(B, S, S)) < V * H * BF16 / 20


def test_memory_keeps_the_position_table_on_the_first_stage_only() -> None:
    """GPT 1.7B (24 layers, h = 2,304, V = 51,200, 2,048 positions, tied embeddings) at TP 2,
    PP 2: both stages hold 12 layers and half the word embedding (the last stage its tied
    copy); the first adds the whole position table, the last the final LayerNorm (2 x h)."""
    from charon_search.layout import Layout
    from charon_search.memory.report import memory_report

    h = 2304
    layout = Layout(tp=2, pp=2, dp=1, schedule="1f1b", micro_batch_size=1,
                    global_batch_size=8, seq_len=2048)
    first, last = memory_report("gpt-1.7b", layout, "h100-sxm-8gpu").to_dict()["stages"]
    assert first["params_bytes"] - last["params_bytes"] == (2048 * h - 2 * h) * BF16
