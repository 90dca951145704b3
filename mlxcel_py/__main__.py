from mlxcel_py.cli.app import main

main()
