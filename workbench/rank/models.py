"""Built-in models (tiny by default, sizes configurable or named by a preset: ``{"size":
"distilbert"}``) and ``package.module:factory`` plug-ins.

Every model maps a batch of inputs to logits. ``task`` tells the trainer how to score them:
``"classification"`` (logits ``[B, C]`` against labels ``[B]``) or ``"lm"`` (logits ``[B, T, V]``
against next tokens ``[B, T]``).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from workbench.config.choices import HF_PREFIX, MODEL_OPTIONS, MODEL_SIZES
from workbench.config.sizes import resolve_model_options


def load_plugin(spec: str, field_name: str) -> Callable[..., Any]:
    """Import ``package.module:factory``; errors name the config field and what failed."""
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(
            f"{field_name}={spec!r}: cannot import module {module_name!r}: {exc}"
        ) from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ValueError(f"{field_name}={spec!r}: module {module_name!r} has no callable {attr!r}")
    return factory


class MLP(nn.Module):
    task = "classification"

    def __init__(self, input_dim: int, hidden_dim: int, num_layers: int, num_classes: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = input_dim
        for _ in range(num_layers):
            layers += [nn.Linear(width, hidden_dim), nn.ReLU()]
            width = hidden_dim
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def shard_blocks(self) -> list[nn.Module]:
        """The hidden layers (the output layer stays with the root)."""
        linear: list[nn.Module] = [m for m in self.net if isinstance(m, nn.Linear)]
        return linear[:-1]


class ResidualBlock(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(y)))


class SmallResNet(nn.Module):
    """A ResNet-style CNN with BatchNorm (so SyncBatchNorm and buffers matter)."""

    task = "classification"

    def __init__(
        self, image_size: int, channels: int, width: int, blocks: int, num_classes: int
    ) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(channels, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU()
        )
        self.blocks = nn.Sequential(*[ResidualBlock(width) for _ in range(blocks)])
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.blocks(self.stem(x))
        return self.head(y.mean(dim=(2, 3)))

    def shard_blocks(self) -> list[nn.Module]:
        """The residual blocks (stem and head stay with the root)."""
        return list(self.blocks)


class _Encoder(nn.Module):
    def __init__(
        self,
        vocab_size: int,
        seq_len: int,
        d_model: int,
        num_heads: int,
        num_layers: int,
        ffn_dim: int,
    ) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, d_model)
        self.positions = nn.Embedding(seq_len, d_model)
        layer = nn.TransformerEncoderLayer(
            d_model, num_heads, ffn_dim, dropout=0.0, batch_first=True, norm_first=True
        )
        self.layers = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        h = self.tokens(ids) + self.positions(pos)
        return self.norm(self.layers(h, mask=mask, is_causal=mask is not None))

    def shard_blocks(self) -> list[nn.Module]:
        """The encoder layers (embeddings and the final norm stay with the root)."""
        return list(self.layers.layers)


class TransformerClassifier(nn.Module):
    """An encoder classifier shaped like DistilBERT (pre-norm layers, first-token pooling)."""

    task = "classification"

    def __init__(
        self,
        vocab_size: int,
        seq_len: int,
        d_model: int,
        num_heads: int,
        num_layers: int,
        ffn_dim: int,
        num_classes: int,
    ) -> None:
        super().__init__()
        self.encoder = _Encoder(vocab_size, seq_len, d_model, num_heads, num_layers, ffn_dim)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(ids)[:, 0])

    def shard_blocks(self) -> list[nn.Module]:
        return self.encoder.shard_blocks()


class GPT(nn.Module):
    """A small causal language model: next-token logits for every position."""

    task = "lm"

    def __init__(
        self, vocab_size: int, seq_len: int, d_model: int, num_heads: int, num_layers: int
    ) -> None:
        super().__init__()
        self.encoder = _Encoder(vocab_size, seq_len, d_model, num_heads, num_layers, 4 * d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1], device=ids.device)
        return self.head(self.encoder(ids, mask))

    def shard_blocks(self) -> list[nn.Module]:
        return self.encoder.shard_blocks()


class _Planted(torch.autograd.Function):
    """Identity on the activations; its forward and its backward each sleep their planted time,
    and the layer's ballast gets a gradient of its size (zeros: what DDP sends is real bytes)."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, ballast: torch.Tensor, fwd_s: float, bwd_s: float
    ) -> Any:
        time.sleep(fwd_s)
        ctx.bwd_s = bwd_s
        ctx.ballast_shape = ballast.shape
        return x.clone()  # a few KiB: the planted sleep is the forward's time

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        time.sleep(ctx.bwd_s)
        return grad, grad.new_zeros(ctx.ballast_shape), None, None


class PlantedLayer(nn.Module):
    """One planted layer: its ballast (``size`` float32 elements) and, on the way through,
    the sleeps its model plants. A module of its own, so that FSDP gathers and reduces each
    layer's ballast as a block, one layer after another."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.ballast = nn.Parameter(torch.zeros(size))

    def forward(self, x: torch.Tensor, fwd_s: float, bwd_s: float) -> torch.Tensor:
        return _Planted.apply(x, self.ballast, fwd_s, bwd_s)  # type: ignore[no-any-return]


class PlantedModel(nn.Module):
    """A workload whose compute does not depend on how many ranks share the cores: ``layers``
    layers, each sleeping its share of ``forward_us`` (+ ``forward_us_per_sample`` a sample) in
    forward and of ``backward_us`` (+ ``backward_us_per_sample``) in backward, so DDP's buckets
    (FSDP's blocks) become ready one layer after another and overlap the backward as on a GPU;
    ``gradient_kib`` KiB of gradients spread over the layers; a small linear head that learns
    the mlp's synthetic labels."""

    task = "classification"

    def __init__(
        self,
        layers: int,
        forward_us: int,
        backward_us: int,
        forward_us_per_sample: int,
        backward_us_per_sample: int,
        gradient_kib: int,
        input_dim: int,
        num_classes: int,
    ) -> None:
        super().__init__()
        per_layer = max(1, gradient_kib * 1024 // 4 // layers)  # float32 elements
        self.layers = nn.ModuleList(PlantedLayer(per_layer) for _ in range(layers))
        self.head = nn.Linear(input_dim, num_classes)
        self.step_us = (forward_us / layers, backward_us / layers)
        self.sample_us = (forward_us_per_sample / layers, backward_us_per_sample / layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        fwd_s = (self.step_us[0] + self.sample_us[0] * n) / 1e6
        bwd_s = (self.step_us[1] + self.sample_us[1] * n) / 1e6
        for layer in self.layers:
            x = layer(x, fwd_s, bwd_s)
        return self.head(x)

    def shard_blocks(self) -> list[nn.Module]:
        """The planted layers (the head stays with the root)."""
        return list(self.layers)


BUILTIN: dict[str, type[nn.Module]] = {
    "mlp": MLP,
    "cnn": SmallResNet,
    "transformer": TransformerClassifier,
    "gpt": GPT,
    "planted": PlantedModel,
}
assert set(BUILTIN) == set(MODEL_OPTIONS) and set(MODEL_SIZES) <= set(BUILTIN)


def build_model(name: str, options: dict[str, Any]) -> nn.Module:
    """A built-in model by name (its defaults, then the preset ``options['size']`` names, then
    the other ``options``; a ConfigError for an unknown size), a Hugging Face model
    (``hf:<name>``, see ``hf_models``) or a plug-in factory's."""
    if name in BUILTIN:
        return BUILTIN[name](**resolve_model_options(name, options))
    if name.startswith(HF_PREFIX):
        from workbench.rank.hf_models import build_hf_model

        return build_hf_model(name, options)
    model = load_plugin(name, "model")(**options)
    if not isinstance(model, nn.Module):
        raise ValueError(
            f"model={name!r}: the factory returned {type(model).__name__}, not a torch.nn.Module"
        )
    return model


def shard_blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks ``strategy='fsdp'`` shards one by one (a parameter group each: one
    all-gather, one reduce-scatter) before the root, which keeps the rest: the model's own
    ``shard_blocks()`` (every built-in model; a plug-in may define one), the layers of a
    Hugging Face model (``hf_models.BLOCKS``), else the modules of every ``nn.ModuleList`` in
    it (where repeated blocks usually live), else none (one group: the root)."""
    own = getattr(model, "shard_blocks", None)
    if callable(own):
        return list(own())
    path = getattr(model, "blocks_path", None)
    if isinstance(path, str):
        return list(model.get_submodule(path).children())
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    inner = {
        id(c) for m in lists for c in m.modules() if c is not m and isinstance(c, nn.ModuleList)
    }
    return [block for m in lists if id(m) not in inner for block in m]


def model_task(model: nn.Module) -> str:
    return getattr(model, "task", "classification")


def takes_dict_batch(model: nn.Module) -> bool:
    """Whether the model takes a dict batch and returns its loss (``batch_format = "dict"``: a
    Hugging Face model, or a plug-in that says so), rather than a tensor to logits."""
    return getattr(model, "batch_format", "tensor") == "dict"


def dict_batch(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> dict[str, Any]:
    """The dict batch of token ids ``inputs``: an attention mask of ones, and the labels (a
    language model's are its inputs: it shifts them itself)."""
    labels = inputs if model_task(model) == "lm" else targets
    return {"input_ids": inputs, "attention_mask": torch.ones_like(inputs), "labels": labels}


def output_loss(output: Any) -> torch.Tensor:
    """The loss a dict-batch model returned: ``output.loss``, ``output["loss"]`` or the output
    itself (a 0-d tensor); a TypeError saying what came back otherwise."""
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, dict):
        loss = output.get("loss")
    if loss is None and isinstance(output, torch.Tensor) and output.numel() == 1:
        loss = output
    if not isinstance(loss, torch.Tensor):
        raise TypeError(
            f"a model taking dict batches must return its loss (a ModelOutput with .loss, a dict "
            f"with 'loss', or a 0-d tensor); it returned {type(output).__name__}"
        )
    return loss


def output_logits(output: Any) -> torch.Tensor:
    """The logits a model returned: the output itself, or ``output.logits``."""
    if isinstance(output, torch.Tensor):
        return output
    logits = getattr(output, "logits", None)
    if logits is None and isinstance(output, dict):
        logits = output.get("logits")
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"evaluation needs logits; the model returned {type(output).__name__}")
    return logits


def gradient_bytes(model: nn.Module) -> int:
    """Bytes of all gradients: what DDP's allreduce moves per step (fp32 buckets)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
