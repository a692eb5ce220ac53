"""What is asked of a model (`facts`: is it one, its layers, its graph;
`ModelFacts`, derived once per export) and which layer created which op of
a trace (`op_layers`)."""
