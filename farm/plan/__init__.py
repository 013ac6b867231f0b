"""From a Graph to a BuildPlan: one spec per distinct kernel and blob, a schedule and a memory plan."""
