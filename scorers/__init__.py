"""Built-in uncertainty scorers, one small numpy module each. Importing registers them."""
