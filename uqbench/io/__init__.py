"""Forward records from anywhere: `recordset` (uqbench's versioned records format, export and
import) and `lmeval` (lm-evaluation-harness samples read as records)."""
