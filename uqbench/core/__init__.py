"""The contracts and the registries: what a run is made of and what plugs into it.

`outputs` (the `Outputs` record scorers read), `scorer` (the `Scorer` contract and its
registry), `registry` (the generic `Registry`), `errors`, `config` (dataclass helpers),
`probs` (stable probability helpers), `plan` (models, gates and methods of a run), `gating`
(the gate registry), `heads` (the head registry), `experiments` (the CARE paper's experiments),
`profiles` (run sizes), `engine` (the seams to the model and figure packages)."""
