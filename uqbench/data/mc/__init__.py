"""The multiple-choice builders: numeric problems with plausible wrong numbers (`numeric`), code
problems with mutants of the reference solution that fail its tests (`code`, `mutations`)."""
