from project.engine import main

if __name__ == "__main__":
    main()
