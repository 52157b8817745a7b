"""The work of one transformer pass over an item, as the plans compare it (encoder images, language samples).

Each model family prices its encoder items with it (its EncoderPort.cost); the step plan balances by it.
Integers, so comparisons are exact and identical on every rank.
"""

from __future__ import annotations


def transformer_cost(tokens: int, attention_len: int, hidden: int, ffn: int) -> int:
    """Multiply-adds per layer of `tokens` tokens, divided by `hidden` (common to every image).

    Per token: q, k, v, o projections 4 h^2, the MLP 2 h ffn, attention scores and values
    2 L h for an attention length L. Divided by h: 4 h + 2 ffn + 2 L. Integers, so comparisons
    are exact and the same on every rank.
    """
    return tokens * (4 * hidden + 2 * ffn + 2 * attention_len)
