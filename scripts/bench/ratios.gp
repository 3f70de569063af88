# The ratio chart of docs/benchmarks.md: time relative to native per
# workload and tool. Run by report.sh as
#   gnuplot -e "dat='ratios.dat'; out='docs/benchmarks.png'" scripts/bench/ratios.gp
# (dat: the table `sessionfs-bench report --chart` writes).
set terminal pngcairo size 1400,900 font ",10" noenhanced
set output out
set title "Time relative to native (lower is better; log scale)"
set style data histogram
set style histogram cluster gap 1
set style fill solid border -1
set logscale y
set yrange [0.1:*]
# Each label ends at its tick and slants down to the left, so the long ones
# (the last workloads) stay inside the picture; the bottom margin holds the
# longest.
set xtics rotate by 40 right
set bmargin 20
set lmargin 10
set key top left
set grid ytics
plot for [i=2:*] dat using i:xtic(1) title columnheader(i)
