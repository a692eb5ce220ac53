"""Residual blocks: Pre-LN, Post-LN and DeepNorm transformer blocks."""

from kerasnorm.blocks.deepnorm import deepnorm_constants
from kerasnorm.blocks.norm_residual import NormResidual
from kerasnorm.blocks.transformer_decoder_block import TransformerDecoderBlock
from kerasnorm.blocks.transformer_encoder_block import TransformerEncoderBlock

__all__ = [
    "NormResidual",
    "TransformerDecoderBlock",
    "TransformerEncoderBlock",
    "deepnorm_constants",
]
