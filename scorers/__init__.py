"""Built-in uncertainty scorers, one small numpy module each. Importing registers them."""
from scorers import care, ensemble, energy, entropy, margin, mc_dropout, msp, routing

__all__ = ["care", "ensemble", "energy", "entropy", "margin", "mc_dropout", "msp", "routing"]
