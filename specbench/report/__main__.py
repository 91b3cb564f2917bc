from specbench.report.report import main

if __name__ == "__main__":
    main()
