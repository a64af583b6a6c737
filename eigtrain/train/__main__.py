"""`python -m eigtrain.train ...` (the form older docs and scripts use) is eigtrain-train."""

from eigtrain.train.command import main

if __name__ == "__main__":
    main()
