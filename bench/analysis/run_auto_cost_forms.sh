#!/bin/sh
# Reruns the offline study of auto's cost-model forms end to end (numpy only, ~2.5 min on 2 cores):
# the main run and four variants, each writing its own results file under bench/analysis/.
set -e
cd "$(dirname "$0")/../.."
A=bench/analysis
python3 $A/auto_cost_forms.py --out $A/auto_cost_forms_results.txt                       # the main run
python3 $A/auto_cost_forms.py --train-planners all --out $A/auto_cost_forms_all_planners.txt
python3 $A/auto_cost_forms.py --suites fasttree,pat,deft,forests --out $A/auto_cost_forms_no_flashforge.txt
python3 $A/auto_cost_forms.py --fit-on h100 --out $A/auto_cost_forms_capacity_h100.txt   # in sample on held-out H100
python3 $A/auto_cost_forms.py --time us_graph --out $A/auto_cost_forms_us_graph.txt 2>/dev/null
