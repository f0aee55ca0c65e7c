from planner_train.train import main

if __name__ == "__main__":
    main()
