"""What a run reads and writes on disk: `cache` (atomic, content-addressed cache entries),
`rundir` (the run folder's file names and readers), `environment` (what a run's numbers depend
on besides its configuration)."""
