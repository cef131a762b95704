"""Hugging Face transformers models with small, random-init configs, as ``ckpt export``
factories (``bench/hf_models.py``): each returns (a module whose forward returns the model's
own training loss, example inputs). Needs torch 2.13 and transformers."""

from __future__ import annotations

import torch
import transformers as T
from torch import nn

VOCAB, SEQ, BATCH = 512, 64, 4


class _LMLoss(nn.Module):
    """The language model's own loss."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, labels=labels).loss


class _ImageLoss(nn.Module):
    """The image classifier's own loss."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values, labels=labels).loss


def _lm(model: nn.Module) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    return _LMLoss(model).train(), (ids, ids.clone())


def _images(model: nn.Module, size: int, batch: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, size, size, generator=g)
    return _ImageLoss(model).train(), (x, torch.randint(0, 10, (batch,), generator=g))


def gpt2():
    return _lm(T.GPT2LMHeadModel(T.GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=128, n_layer=4, n_head=4,
                                              resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)))


def llama():
    return _lm(T.LlamaForCausalLM(T.LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=344,
                                                num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                                                max_position_embeddings=SEQ)))


def mistral():
    return _lm(T.MistralForCausalLM(T.MistralConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256,
                                                    num_hidden_layers=4, num_attention_heads=4,
                                                    num_key_value_heads=1, max_position_embeddings=SEQ,
                                                    sliding_window=32)))


def bert():
    return _lm(T.BertForMaskedLM(T.BertConfig(vocab_size=VOCAB, hidden_size=128, num_hidden_layers=4,
                                              num_attention_heads=4, intermediate_size=512,
                                              max_position_embeddings=SEQ, hidden_dropout_prob=0.0,
                                              attention_probs_dropout_prob=0.0)))


def distilbert():
    return _lm(T.DistilBertForMaskedLM(T.DistilBertConfig(vocab_size=VOCAB, dim=128, n_layers=4, n_heads=4,
                                                          hidden_dim=512, max_position_embeddings=SEQ,
                                                          dropout=0.0, attention_dropout=0.0)))


def t5():
    return _lm(T.T5ForConditionalGeneration(T.T5Config(vocab_size=VOCAB, d_model=128, d_kv=32, d_ff=256,
                                                       num_layers=3, num_decoder_layers=3, num_heads=4,
                                                       dropout_rate=0.0, decoder_start_token_id=0,
                                                       pad_token_id=0)))


def vit():
    return _images(T.ViTForImageClassification(T.ViTConfig(image_size=32, patch_size=4, num_channels=3,
                                                           hidden_size=96, num_hidden_layers=4,
                                                           num_attention_heads=4, intermediate_size=384,
                                                           hidden_dropout_prob=0.0,
                                                           attention_probs_dropout_prob=0.0, num_labels=10)),
                   32, 8)


def convnext():
    return _images(T.ConvNextForImageClassification(T.ConvNextConfig(num_channels=3, hidden_sizes=[32, 64, 128, 256],
                                                                     depths=[1, 1, 2, 1], num_labels=10,
                                                                     image_size=64)), 64, 4)


MODELS = ("gpt2", "llama", "mistral", "bert", "distilbert", "t5", "vit", "convnext")
