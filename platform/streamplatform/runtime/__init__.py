"""The engine that runs a Topology's tasks: in-process (TopologyTestDriver) or on Spark."""
