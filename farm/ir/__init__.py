"""The intermediate forms every stage shares: the graph, the specs of compile units and the loop IR."""
