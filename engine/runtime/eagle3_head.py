"""An EAGLE-3 draft head (Li et al., 2025) in the public checkpoint layout.

The head drafts from the target's own features: the residual stream entering three of the
target's layers (low, middle, high; `layer_ids`), concatenated and fused by `fc` to the
head's width. One decoder layer then reads [its input token's embedding ‖ that feature]
(each normed: `input_layernorm`, `hidden_norm`) and predicts the next token over a reduced
draft vocabulary (`lm_head`; `d2t` maps a draft id d to the target id d + d2t[d]). For a
token the head drafted itself, the feature is the head's own output at the parent token:
that is how it drafts several tokens deep.

The layout is the one the EAGLE repository, SpecForge, vLLM and llama.cpp's converter read:
`config.json` (`draft_vocab_size`, `num_hidden_layers` 1, and optionally
`eagle_config.eagle_aux_hidden_state_layer_ids`, `target_hidden_size`) and weights named
`fc.weight`, `midlayer.*`, `norm.weight`, `lm_head.weight`, `d2t`, `t2d` (and, in some
heads, `embed_tokens.weight`), in `model.safetensors` or `pytorch_model.bin`. Layer ids
count layer inputs, as llama.cpp's `llama_set_embeddings_layer_inp` and vLLM do (the
default is 2, n/2 and n-3 of a target with n layers): id i is transformers'
`hidden_states[i]`.

The attention is left to the caller (a cache with tree masks when drafting, the unrolled
"training-time test" mask when training), so this module holds only the layer's arithmetic.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from ..errors import ModelLoadError

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
LEGACY_WEIGHTS_FILE = "pytorch_model.bin"
ARCHITECTURE = "LlamaForCausalLMEagle3"


@dataclass(frozen=True)
class Eagle3Config:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    target_hidden_size: int
    vocab_size: int  # the target's
    draft_vocab_size: int
    layer_ids: tuple[int, ...]
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 8192
    extra: dict = field(default_factory=dict, compare=False)  # other keys of a published config, kept

    @classmethod
    def from_json(cls, data: dict[str, Any], target_layers: int | None = None) -> Eagle3Config:
        """Read a published head's config. Layer ids come from `eagle_config`, or are the
        default 2, n/2, n-3 of the target (whose layer count must then be known)."""
        try:
            hidden = int(data["hidden_size"])
            heads = int(data["num_attention_heads"])
            eagle = data.get("eagle_config") or {}
            ids = eagle.get("eagle_aux_hidden_state_layer_ids") or data.get("eagle_aux_hidden_state_layer_ids")
            if ids is None:
                if target_layers is None:
                    raise ModelLoadError("The EAGLE-3 head's config names no target layers, and the target's layer count is unknown.")
                ids = default_layer_ids(target_layers)
            if int(data.get("num_hidden_layers", 1)) != 1:
                raise ModelLoadError("An EAGLE-3 head has one decoder layer; this config has "
                                     f"{data['num_hidden_layers']}.")
            known = {
                "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                "target_hidden_size", "vocab_size", "draft_vocab_size", "rms_norm_eps", "rope_theta", "rope_scaling",
                "max_position_embeddings", "eagle_config", "eagle_aux_hidden_state_layer_ids",
            }
            return cls(
                hidden_size=hidden,
                intermediate_size=int(data["intermediate_size"]),
                num_attention_heads=heads,
                num_key_value_heads=int(data.get("num_key_value_heads") or heads),
                head_dim=int(data.get("head_dim") or hidden // heads),
                target_hidden_size=int(data.get("target_hidden_size") or hidden),
                vocab_size=int(data["vocab_size"]),
                draft_vocab_size=int(data.get("draft_vocab_size") or data["vocab_size"]),
                layer_ids=tuple(int(i) for i in ids),
                rms_norm_eps=float(data.get("rms_norm_eps", 1e-5)),
                rope_theta=float(data.get("rope_theta", 10000.0)),
                rope_scaling=data.get("rope_scaling"),
                max_position_embeddings=int(data.get("max_position_embeddings", 8192)),
                extra={key: value for key, value in data.items() if key not in known},
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ModelLoadError(f"The EAGLE-3 head's config cannot be read: {error!r}") from error

    def to_json(self) -> dict[str, Any]:
        data = {key: value for key, value in asdict(self).items() if key not in ("layer_ids", "extra")}
        data.update(self.extra)
        data.update({
            "architectures": [ARCHITECTURE],
            "model_type": "llama",
            "num_hidden_layers": 1,
            "tie_word_embeddings": False,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(self.layer_ids)},
        })
        return data

    @property
    def feature_width(self) -> int:
        return len(self.layer_ids) * self.target_hidden_size


def default_layer_ids(target_layers: int) -> tuple[int, int, int]:
    """Low, middle and high: the inputs of layers 2, n/2 and n-3 (EAGLE-3's own choice),
    kept inside a target too shallow for them."""
    return (min(2, target_layers - 1), target_layers // 2, max(target_layers - 3, 0))


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class _Attention(nn.Module):
    def __init__(self, config: Eagle3Config):
        super().__init__()
        inputs = 2 * config.hidden_size  # [token embedding ‖ feature]
        self.q_proj = nn.Linear(inputs, config.num_attention_heads * config.head_dim, bias=False)
        self.k_proj = nn.Linear(inputs, config.num_key_value_heads * config.head_dim, bias=False)
        self.v_proj = nn.Linear(inputs, config.num_key_value_heads * config.head_dim, bias=False)
        self.o_proj = nn.Linear(config.num_attention_heads * config.head_dim, config.hidden_size, bias=False)


class _Mlp(nn.Module):
    def __init__(self, config: Eagle3Config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _MidLayer(nn.Module):
    def __init__(self, config: Eagle3Config):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = _Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = _Mlp(config)


class Eagle3Head(nn.Module):
    def __init__(self, config: Eagle3Config):
        super().__init__()
        self.config = config
        self.fc = nn.Linear(config.feature_width, config.hidden_size, bias=False)
        self.midlayer = _MidLayer(config)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(config.vocab_size, dtype=torch.bool))
        self.register_buffer("inv_freq", _inverse_frequencies(config), persistent=False)
        self.embed_tokens: nn.Embedding | None = None  # only heads that ship their own

    def _apply(self, fn, recurse=True):
        """`.to()`, `.half()` and the like, except that the rotary frequencies stay float32:
        rounded to bf16 they put a head_dim-128 head's angles a radian off by position 1,000."""
        super()._apply(fn, recurse)
        self.inv_freq = _inverse_frequencies(self.config).to(self.inv_freq.device)
        return self

    # The layer's arithmetic, in the order a step runs it

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """(..., 3·H_target) target features -> (..., H) the head's input feature."""
        return self.fc(features)

    def attention_inputs(
        self, embeddings: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values (B, heads, T, head_dim), rotated to `positions` (B, T),
        from token embeddings and input features (B, T, H)."""
        layer, config = self.midlayer, self.config
        x = torch.cat((layer.input_layernorm(embeddings), layer.hidden_norm(hidden)), dim=-1)  # (B, T, 2H)
        batch, count = x.shape[:2]
        query = layer.self_attn.q_proj(x).view(batch, count, config.num_attention_heads, config.head_dim).transpose(1, 2)
        key = layer.self_attn.k_proj(x).view(batch, count, config.num_key_value_heads, config.head_dim).transpose(1, 2)
        value = layer.self_attn.v_proj(x).view(batch, count, config.num_key_value_heads, config.head_dim).transpose(1, 2)
        cos, sin = self.rotary(positions, x.dtype)
        return _rotate(query, cos, sin), _rotate(key, cos, sin), value

    def finish(self, attended: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """(B, heads, T, head_dim) attention output -> (B, T, H) the layer's output, which is
        also the feature a drafted child token reads."""
        layer = self.midlayer
        batch, _, count, _ = attended.shape
        hidden = hidden + layer.self_attn.o_proj(attended.transpose(1, 2).reshape(batch, count, -1))
        return hidden + layer.mlp(layer.post_attention_layernorm(hidden))

    def draft_logits(self, output: torch.Tensor) -> torch.Tensor:
        """(..., H) layer output -> (..., draft vocabulary) logits."""
        return self.lm_head(self.norm(output))

    def rotary(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        angles = positions[..., None].float() * self.inv_freq  # (B, T, head_dim / 2)
        angles = torch.cat((angles, angles), dim=-1)[:, None]  # (B, 1, T, head_dim)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    @property
    def target_ids(self) -> torch.Tensor:
        """(draft vocabulary,) the target id of each draft id."""
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _inverse_frequencies(config: Eagle3Config) -> torch.Tensor:
    """RoPE frequencies, with Llama 3's scaling when the config asks for it (heads for
    Llama 3.x targets do)."""
    inverse = 1.0 / (config.rope_theta ** (torch.arange(0, config.head_dim, 2).float() / config.head_dim))
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type") or scaling.get("type")
    if kind in (None, "default"):
        return inverse
    if kind != "llama3":
        raise ModelLoadError(f"The EAGLE-3 head uses rope scaling {kind!r}, which Tandem does not run.")
    factor, low, high = float(scaling["factor"]), float(scaling.get("low_freq_factor", 1)), float(scaling.get("high_freq_factor", 4))
    original = float(scaling.get("original_max_position_embeddings", 8192))
    wavelength = 2 * math.pi / inverse
    smooth = ((original / wavelength) - low) / (high - low)
    scaled = torch.where(wavelength > original / low, inverse / factor, inverse)
    between = (wavelength <= original / low) & (wavelength >= original / high)
    return torch.where(between, (1 - smooth) * inverse / factor + smooth * inverse, scaled)


# Files


def save_head(head: Eagle3Head, folder: Path, dtype: torch.dtype = torch.bfloat16) -> None:
    """Write `head` in the public layout (weights as `dtype`; the maps as integers)."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, value in head.state_dict().items():
        value = value.detach().contiguous()
        tensors[name] = value if name in ("d2t", "t2d") else value.to(dtype)
    save_file(tensors, str(folder / WEIGHTS_FILE))
    (folder / CONFIG_FILE).write_text(json.dumps(head.config.to_json() | {"torch_dtype": str(dtype).removeprefix("torch.")}, indent=2) + "\n")


def is_eagle3_folder(folder: Path) -> bool:
    """Whether `folder` holds an EAGLE-3 head (judged by its config, as llama.cpp does)."""
    try:
        data = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    architectures = data.get("architectures") or []
    return ("draft_vocab_size" in data and int(data.get("num_hidden_layers", 0)) == 1) or any("Eagle3" in name for name in architectures)


def load_head(folder: Path, target_layers: int | None = None) -> Eagle3Head:
    """The head in `folder`; a `ModelLoadError` that says what is wrong with a broken one."""
    try:
        data = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
    except OSError as error:
        raise ModelLoadError(f"{folder} holds no EAGLE-3 head: {error.strerror} ({CONFIG_FILE}).") from error
    except ValueError as error:
        raise ModelLoadError(f"The EAGLE-3 head's {CONFIG_FILE} in {folder} is not valid JSON: {error}.") from error
    config = Eagle3Config.from_json(data, target_layers)
    tensors = _read_weights(folder)
    head = Eagle3Head(config)
    if "embed_tokens.weight" in tensors:
        head.embed_tokens = nn.Embedding(*tensors["embed_tokens.weight"].shape)
    expected = head.state_dict()
    missing = sorted(set(expected) - set(tensors) - {"t2d"})
    if missing:
        raise ModelLoadError(f"The EAGLE-3 head in {folder} lacks {', '.join(missing[:4])}" + (" …" if len(missing) > 4 else "") + ".")
    for name, value in expected.items():
        if name in tensors and tuple(tensors[name].shape) != tuple(value.shape):
            raise ModelLoadError(
                f"The EAGLE-3 head in {folder} has {name} of shape {tuple(tensors[name].shape)}, "
                f"where its config says {tuple(value.shape)}."
            )
    with torch.no_grad():
        for name, value in expected.items():
            if name in tensors:
                value.copy_(tensors[name].to(value.dtype))
    if "t2d" not in tensors:  # some heads ship only d2t; t2d follows from it
        head.t2d.zero_()
        head.t2d[head.target_ids.clamp(0, config.vocab_size - 1)] = True
    ids = head.target_ids
    if int(ids.min()) < 0 or int(ids.max()) >= config.vocab_size or len(set(ids.tolist())) != len(ids):
        raise ModelLoadError(f"The EAGLE-3 head in {folder} maps its draft vocabulary outside the target's (d2t is corrupt).")
    return head.eval()


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    if (folder / WEIGHTS_FILE).is_file():
        try:
            return load_file(str(folder / WEIGHTS_FILE))
        except (SafetensorError, OSError) as error:
            raise ModelLoadError(f"The EAGLE-3 head's weights in {folder} cannot be read: {error}.") from error
    if (folder / LEGACY_WEIGHTS_FILE).is_file():
        try:  # weights only: never unpickle code from a downloaded file
            return torch.load(folder / LEGACY_WEIGHTS_FILE, map_location="cpu", weights_only=True)
        except Exception as error:  # torch raises many kinds for a damaged file
            raise ModelLoadError(f"The EAGLE-3 head's weights in {folder} cannot be read: {error}.") from error
    raise ModelLoadError(f"{folder} holds no EAGLE-3 weights ({WEIGHTS_FILE} or {LEGACY_WEIGHTS_FILE}).")


def check_fits_target(head: Eagle3Head, target_hidden: int, target_vocab: int, target_layers: int) -> None:
    """Refuse, with the reason, a head that was made for another target."""
    config = head.config
    if config.target_hidden_size != target_hidden:
        raise ModelLoadError(
            f"This EAGLE-3 head reads features {config.target_hidden_size} wide, and the target's are {target_hidden}: "
            "it was trained for another model."
        )
    if config.vocab_size != target_vocab:
        raise ModelLoadError(
            f"This EAGLE-3 head's vocabulary has {config.vocab_size} tokens and the target's {target_vocab}: "
            "it was trained for another model."
        )
    if len(config.layer_ids) != 3 or any(not 0 <= layer < target_layers for layer in config.layer_ids):
        raise ModelLoadError(
            f"This EAGLE-3 head reads target layers {list(config.layer_ids)}, and the target has {target_layers} "
            "(an EAGLE-3 head reads three of them)."
        )
