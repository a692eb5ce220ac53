"""DeepNorm constants (Wang et al., 2022; docs/design.md §3)."""

from kerasnorm._core.validation import check_positive_int


def deepnorm_constants(encoder_layers=None, decoder_layers=None):
    """DeepNorm's residual scale `alpha` and initialization gain `beta`.

    `N = encoder_layers`, `M = decoder_layers`:

    ```python
    encoder only:     {"encoder": ((2N)**(1/4), (8N)**(-1/4))}
    decoder only:     {"decoder": ((2M)**(1/4), (8M)**(-1/4))}
    encoder-decoder:  {"encoder": (0.81 * (N**4 * M)**(1/16),
                                   0.87 * (N**4 * M)**(-1/16)),
                       "decoder": ((3M)**(1/4), (12M)**(-1/4))}
    ```

    `alpha` multiplies the residual branch, `x_{l+1} = LN(alpha * x_l + F(x_l))`;
    `beta` is the gain of the Xavier-normal initialization of the feed-forward
    weights and the attention value and output projections.

    Examples:
        >>> import kerasnorm
        >>> alpha, beta = kerasnorm.deepnorm_constants(encoder_layers=48)["encoder"]
        >>> round(alpha, 4), round(beta, 4)
        (3.1302, 0.2259)

    Args:
        encoder_layers: number of encoder layers N, or `None` for a
            decoder-only model. Defaults to `None`.
        decoder_layers: number of decoder layers M, or `None` for an
            encoder-only model. Defaults to `None`.

    Returns:
        A dict with an `"encoder"` and/or a `"decoder"` entry, each an
        `(alpha, beta)` tuple of floats: only the entries that apply.

    Reference:
        - [Wang et al., 2022](https://arxiv.org/abs/2203.00555), Table 1 and
          Figure 2.
    """
    if encoder_layers is None and decoder_layers is None:
        raise ValueError(
            "Pass `encoder_layers`, `decoder_layers` or both. Received: "
            "encoder_layers=None, decoder_layers=None"
        )
    if encoder_layers is not None:
        n = check_positive_int(encoder_layers, "encoder_layers")
    if decoder_layers is not None:
        m = check_positive_int(decoder_layers, "decoder_layers")
    if decoder_layers is None:
        return {"encoder": ((2 * n) ** 0.25, (8 * n) ** -0.25)}
    if encoder_layers is None:
        return {"decoder": ((2 * m) ** 0.25, (8 * m) ** -0.25)}
    depth = n**4 * m
    return {
        "encoder": (0.81 * depth ** (1 / 16), 0.87 * depth ** (-1 / 16)),
        "decoder": ((3 * m) ** 0.25, (12 * m) ** -0.25),
    }
