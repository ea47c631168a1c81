"""models.reinitialize: the top layers drawn anew as BERT draws them, everything below kept."""

import pytest
import torch
from conftest import make_tiny_bert
from transformers import BertConfig, BertModel

from dpr_pipeline.errors import ConfigError
from dpr_pipeline.models.embedding import load_text_encoder
from dpr_pipeline.models.reinitialize import reinitialize_top_layers, write_reinitialized_start


def tiny_bert(seed: int = 0) -> BertModel:
    torch.manual_seed(seed)
    return BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                                intermediate_size=32, max_position_embeddings=32), add_pooling_layer=False)


def trained_like(model: BertModel) -> BertModel:
    """Weights no initialiser draws (so a kept tensor and a re-drawn one cannot be confused)."""
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.5)
    return model


def test_the_top_layers_are_drawn_anew_and_the_rest_is_kept():
    model = trained_like(tiny_bert())
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    reinitialize_top_layers(model, 1, seed=3)
    after = model.state_dict()
    top = "encoder.layer.2."
    for name, tensor in after.items():
        if not name.startswith(top):
            assert torch.equal(tensor, before[name]), name
    # the first linear of the top layer: the generator's first draw, N(0, 0.02) (BERT's initializer_range)
    query = after[top + "attention.self.query.weight"]
    expected = torch.empty_like(query).normal_(0.0, 0.02, generator=torch.Generator().manual_seed(3))
    assert torch.equal(query, expected)
    assert torch.equal(after[top + "attention.self.query.bias"], torch.zeros(16))
    assert torch.equal(after[top + "output.LayerNorm.weight"], torch.ones(16))
    assert torch.equal(after[top + "output.LayerNorm.bias"], torch.zeros(16))
    dense = [name for name in after if name.startswith(top) and name.endswith("dense.weight")]
    weights = torch.cat([after[name].flatten() for name in dense])
    assert abs(weights.std().item() - 0.02) < 0.002


def test_the_draw_is_the_seed_s():
    first, second, other = (trained_like(tiny_bert()) for _ in range(3))
    reinitialize_top_layers(first, 2, seed=7)
    reinitialize_top_layers(second, 2, seed=7)
    reinitialize_top_layers(other, 2, seed=8)
    name = "encoder.layer.1.intermediate.dense.weight"
    assert torch.equal(first.state_dict()[name], second.state_dict()[name])
    assert not torch.equal(first.state_dict()[name], other.state_dict()[name])


@pytest.mark.parametrize("layers", [0, 4])
def test_a_count_the_encoder_does_not_have_is_refused(layers):
    with pytest.raises(ConfigError, match=r"pretrain.reinitialize_layers: .* Fix: choose 1 to 3"):
        reinitialize_top_layers(tiny_bert(), layers, seed=0)


def test_the_written_start_is_the_plm_with_its_top_layer_drawn_and_its_pooling_kept(tmp_path):
    plm = make_tiny_bert(tmp_path / "plm")
    write_reinitialized_start(str(plm), 1, seed=5, output_dir=tmp_path / "start", max_length=48)
    before, after = load_text_encoder(str(plm)), load_text_encoder(str(tmp_path / "start"))
    assert after.pooling == before.pooling == "cls"
    reinitialize_top_layers(before.transformer, 1, seed=5)  # the same draw, done here
    for name, tensor in after.transformer.state_dict().items():
        assert torch.equal(tensor, before.transformer.state_dict()[name]), name
