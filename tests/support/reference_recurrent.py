"""float64 numpy references of the layer-normalized cells (docs/design.md).

Written from the equations, step by step, independently of kerasnorm: every
function takes the weights as a dict of arrays keyed by weight name.
"""

import numpy as np


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def ln(z, gamma, beta, eps):
    """LN over the last axis: (z - mean) / sqrt(var + eps) * gamma + beta."""
    mean = z.mean(axis=-1, keepdims=True)
    var = ((z - mean) ** 2).mean(axis=-1, keepdims=True)
    return (z - mean) / np.sqrt(var + eps) * gamma + beta


def _bias(p, width):
    return p["bias"] if "bias" in p else np.zeros(width)


def simple_rnn_step(x, states, p, eps, activation=np.tanh):
    """h = f(LN(x W + h U) + b)."""
    (h,) = states
    a = x @ p["kernel"] + h @ p["recurrent_kernel"]
    out = activation(
        ln(a, p["norm_gamma"], p["norm_beta"], eps) + _bias(p, a.shape[-1])
    )
    return out, [out]


def lstm_step(x, states, p, eps):
    """Eqs. 20-22, gate order i, f, g, o; LNs over all 4H units jointly."""
    h, c = states
    units = h.shape[-1]
    z = (
        ln(x @ p["kernel"], p["input_norm_gamma"], p["input_norm_beta"], eps)
        + ln(
            h @ p["recurrent_kernel"],
            p["recurrent_norm_gamma"],
            p["recurrent_norm_beta"],
            eps,
        )
        + _bias(p, 4 * units)
    )
    i, f, g, o = (z[:, k * units : (k + 1) * units] for k in range(4))
    c_new = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
    h_new = sigmoid(o) * np.tanh(
        ln(c_new, p["cell_norm_gamma"], p["cell_norm_beta"], eps)
    )
    return h_new, [h_new, c_new]


def gru_step(x, states, p, eps):
    """Eqs. 24-25 in Keras' convention (reset after the recurrent product).

    LN_x/LN_h over the 2H (z, r) units together, LN_x2/LN_h2 over the H
    candidate units; the gains/biases of a (3H,) weight are split [:2H], [2H:].
    """
    (h,) = states
    units = h.shape[-1]
    two = 2 * units

    def split_ln(v, name):
        g, b = p[f"{name}_gamma"], p[f"{name}_beta"]
        return (
            ln(v[:, :two], g[:two], b[:two], eps),
            ln(v[:, two:], g[two:], b[two:], eps),
        )

    xw = x @ p["kernel"]
    hu = h @ p["recurrent_kernel"]
    bias = _bias(p, 3 * units)
    x_zr, x_h = split_ln(xw, "input_norm")
    h_zr, h_h = split_ln(hu, "recurrent_norm")
    zr = x_zr + h_zr + bias[:two]
    z = sigmoid(zr[:, :units])
    r = sigmoid(zr[:, units:])
    candidate = np.tanh(x_h + bias[two:] + r * h_h)
    h_new = z * h + (1.0 - z) * candidate
    return h_new, [h_new]


def run(step, x, states, mask=None, go_backwards=False):
    """Keras RNN semantics: masked steps keep the states and repeat the
    previous output; `go_backwards` returns the reversed sequence.

    Returns `(outputs (B, T, H), final_states)`.
    """
    x = np.asarray(x, np.float64)
    states = [np.asarray(s, np.float64) for s in states]
    steps = range(x.shape[1])
    if go_backwards:
        steps = reversed(steps)
    outputs = []
    prev = np.zeros_like(states[0])
    for t in steps:
        out, new = step(x[:, t], states)
        if mask is not None:
            m = np.asarray(mask[:, t], bool)[:, None]
            out = np.where(m, out, prev)
            new = [np.where(m, n, s) for n, s in zip(new, states, strict=True)]
        outputs.append(out)
        prev, states = out, new
    return np.stack(outputs, axis=1), states
