"""`naiad repo lint`: checks a model repository without a server and prints every problem."""
