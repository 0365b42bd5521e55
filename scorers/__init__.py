"""Built-in uncertainty scorers, one small numpy module each. Importing registers them."""
from scorers import care, energy, ensemble, entropy, features, margin, mc_dropout, msp, routing

__all__ = ["care", "energy", "ensemble", "entropy", "features", "margin", "mc_dropout", "msp",
           "routing"]
