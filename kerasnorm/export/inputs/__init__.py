"""What an artifact is fed: the model's input structure and user data
converted to it (`data`: the one parser, the one rule for what a check runs
on, `inputs_to_check`, and the refusal of data that does not fit the file's
shapes, `check_fits`); the shapes a file's inputs take (`shapes`: which
dimensions stay dynamic); the second shape a dynamic artifact is checked at
(`second_shape`)."""
