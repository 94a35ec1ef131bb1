"""Running the code location in-process as the Dagster daemon would (``in_process``): what
`make demo` and the tests use. The jobs, schedules and sensors themselves come from
``streamplatform.dagster`` (DLQ replays, lag and late-version backfill sensors) and from
``assets`` (``enriched_backfill``)."""
